"""Attention patterns of deposit heads on held-out examples, as circuitsvis widgets.

Which heads: every head that ``probes.deposit`` flagged (lowest seed of each encoding × task),
and, for each task-1 model with a rotary part where nothing was flagged, the layer-0 head whose
ablation hurts most (:func:`pe_interp.sweep.probing.choose_head`). Each widget shows the chosen
head first, then the other heads of its layer in order of ablation drop, on one held-out
example. The patterns are what the sweep stored (``attention.json``); widgets come from
``probes.heads.view.patterns_html``, and the bundle is inlined once by
:class:`~pe_interp.report.cvis.InlineWidgets`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from pe_interp.report.cvis import InlineWidgets
from pe_interp.report.data import CellInfo, label_order
from pe_interp.report.figures import ROTARY_KINDS, attention_image
from pe_interp.sweep.attention_probe import choose_head
from probes.heads.view import patterns_html

MAX_MODELS = 8


@dataclass(frozen=True)
class Pick:
    cell: CellInfo
    layer: int
    head: int
    why: str


def pick_heads(cells: list[CellInfo]) -> list[Pick]:
    order = {lab: i for i, lab in enumerate(label_order(cells))}
    picks: list[Pick] = []
    seen: set[tuple[str, str]] = set()

    def pick(c: CellInfo) -> None:
        chosen = choose_head(c.ablation, c.deposits, c.task, c.kind)
        if chosen is not None:
            picks.append(Pick(c, *chosen))
            seen.add((c.label, c.task))

    usable = [c for c in cells if c.ablation is not None and c.deposits is not None]
    for c in sorted(usable, key=lambda c: (c.task != "distance", order.get(c.label, 99), c.seed)):
        if (c.label, c.task) not in seen and c.found:
            pick(c)
    for c in sorted(usable, key=lambda c: (order.get(c.label, 99), c.seed)):
        if c.task == "distance" and c.kind in ROTARY_KINDS and (c.label, c.task) not in seen:
            pick(c)
    return picks[:MAX_MODELS]


def attention_section(cells: list[CellInfo], widgets: InlineWidgets) -> str:
    picks = pick_heads(cells)
    if not picks:
        return "<p class='note'>No model with an ablation sweep to choose a head from.</p>"
    parts = []
    for p in picks:
        c = p.cell
        title = (
            f"{html.escape(c.label)} · {html.escape(c.task)} · seed {c.seed} · layer {p.layer}, "
            f"head {p.head} ({html.escape(p.why)})"
        )
        parts.append(f"<h4>{title}</h4>")
        stored = c.attention
        if stored is None or stored.layer != p.layer:
            parts.append(
                "<p class='warn'>the sweep stored no attention patterns of this layer "
                "(attention.json; rerun `pe-interp reproduce` to add them)</p>"
            )
            continue
        drops = np.nan_to_num(c.ablation.drops[p.layer], nan=-np.inf)
        for ex in stored.examples:
            others = sorted((h for layer, h in ex.heads if h != p.head), key=lambda h: -drops[h])
            heads = [(p.layer, h) for h in [p.head, *others] if (p.layer, h) in ex.heads]
            if not heads or heads[0] != (p.layer, p.head):
                parts.append(
                    f"<p class='warn'>example {ex.example}: no stored pattern of head {p.head}</p>"
                )
                continue
            caption = (
                f"held-out example {ex.example}: label {ex.label}, {ex.n} tokens; heads "
                f"{', '.join(f'L{a}H{b}' for a, b in heads)} (the first is the chosen one); T1/T2 = "
                f"the distance triggers, T = a counted trigger, @ = position"
            )
            block = None
            if not widgets.error:
                # Bidirectional attention has weights above the diagonal: do not grey them out.
                props = {
                    "maskUpperTri": (c.config or {}).get("model", {}).get("attention_dir")
                    == "causal"
                }
                block = widgets.add(patterns_html(ex, heads), props=props)
            if block is None:
                block = (
                    f"<img alt='attention pattern' src='"
                    f"{attention_image(ex.head(p.layer, p.head), list(ex.tokens), f'L{p.layer}H{p.head}, example {ex.example}')}'>"
                )
            parts.append(f"<p class='caption'>{html.escape(caption)}</p>{block}")
    head = ""
    if widgets.error:
        head = (
            f"<p class='warn'>Interactive circuitsvis widgets are unavailable "
            f"({html.escape(widgets.error)}); static images of the chosen head are shown instead.</p>"
        )
    return head + "\n".join(parts)

"""Attention patterns of deposit heads on held-out examples, as circuitsvis widgets.

Which heads: every head that ``probes.deposit`` flagged (lowest seed of each encoding × task),
and, for each task-1 model with a rotary part where nothing was flagged, the layer-0 head whose
ablation hurts most. Each widget shows the chosen head first, then the other heads of its layer
in order of ablation drop (all of them for short inputs, the top three otherwise), on one
held-out example. Widgets come from ``probes.viz.attention_html``; the bundle is inlined once by
:class:`~pe_interp.report.cvis.InlineWidgets`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from pe_interp.report.cvis import InlineWidgets
from pe_interp.report.data import CellInfo, label_order
from pe_interp.report.figures import ROTARY_KINDS, attention_image

MAX_MODELS = 8
N_EXAMPLES = 2
# Above this many attention weights per widget (heads × n × n), show the chosen head and the three
# other heads of its layer whose ablation hurts most, so paper-size pages stay a few MB.
MAX_WEIGHTS = 60_000


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
    for c in sorted(cells, key=lambda c: (c.task != "distance", order.get(c.label, 99), c.seed)):
        if (c.label, c.task) in seen or c.ablation is None:
            continue
        flag = c.flag
        if flag.found and flag.layer is not None:
            head = flag.head if flag.head is not None else c.ablation.layer_stats(flag.layer).top_head
            picks.append(Pick(c, flag.layer, head, "flagged deposit head"))
            seen.add((c.label, c.task))
    for c in sorted(cells, key=lambda c: (order.get(c.label, 99), c.seed)):
        if c.task != "distance" or c.kind not in ROTARY_KINDS or c.ablation is None:
            continue
        if (c.label, c.task) in seen:
            continue
        st = c.ablation.layer_stats(0)
        picks.append(Pick(c, 0, st.top_head, f"no deposit flagged; top layer-0 head (drop {100 * st.top_drop:.1f} pts)"))
        seen.add((c.label, c.task))
    return picks[:MAX_MODELS]


def token_names(task, tokens: list[int], pad_id: int = 0) -> list[str]:
    """Fallback labels (``probes.viz.token_labels`` is used when available): triggers as
    ``T<k>:<id>``, pads as ``·``, each with its position, so labels are unique."""
    trig = list(getattr(task, "triggers", ()))
    out = []
    for pos, t in enumerate(tokens):
        if t == pad_id:
            name = "·"
        elif t in trig:
            name = f"T{trig.index(t) + 1}:{t}" if len(trig) <= 4 else f"T:{t}"
        else:
            name = str(t)
        out.append(f"{name}@{pos}")
    return out


def _widget_html(model, task, tokens, pad_mask, heads: list[tuple[int, int]], example: int) -> str:
    """circuitsvis ``attention_heads`` of ``heads`` on one example, as ``local_src`` HTML: through
    ``probes.viz.attention_html`` when it is importable, else directly."""
    try:
        from probes.viz import attention_html
    except ImportError:
        attention_html = None
    if attention_html is not None:
        return attention_html(model, tokens, heads, example=example, pad_mask=pad_mask, task=task)
    import circuitsvis.attention as cva
    import torch

    layer = heads[0][0]
    name = f"blocks.{layer}.attn.hook_pattern"
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[example : example + 1], pad_mask[example : example + 1],
                                        names_filter=[name])
    n = int(pad_mask[example].sum()) if model.cfg.mask_padding else tokens.shape[1]
    att = cache[name][0, [h for _, h in heads], :n, :n].double().cpu().numpy().round(3)
    return cva.attention_heads(attention=att.tolist(), tokens=token_names(task, tokens[example, :n].tolist()),
                               attention_head_names=[f"L{a}H{b}" for a, b in heads]).local_src


def attention_section(cells: list[CellInfo], widgets: InlineWidgets) -> str:
    picks = pick_heads(cells)
    if not picks:
        return "<p class='note'>No model with an ablation sweep to choose a head from.</p>"
    import torch

    from pe_interp.checkpoint import CheckpointError, load_run

    parts = []
    for p in picks:
        c = p.cell
        title = (f"{html.escape(c.label)} · {html.escape(c.task)} · seed {c.seed} · layer {p.layer}, "
                 f"head {p.head} ({html.escape(p.why)})")
        try:
            run = load_run(c.run_dir)
        except (CheckpointError, OSError, ValueError) as err:
            parts.append(f"<h4>{title}</h4><p class='warn'>cannot load the model: {html.escape(str(err))}</p>")
            continue
        test = run.test_set(N_EXAMPLES)
        model, task = run.model, run.task
        H = model.cfg.n_heads
        drops = np.nan_to_num(c.ablation.drops[p.layer], nan=-np.inf)
        others = sorted((h for h in range(H) if h != p.head), key=lambda h: -drops[h])
        parts.append(f"<h4>{title}</h4>")
        for i in range(len(test)):
            n = int(test.pad_mask[i].sum()) if model.cfg.mask_padding else test.tokens.shape[1]
            shown = [p.head] + (others if H * n * n <= MAX_WEIGHTS else others[:3])
            heads = [(p.layer, h) for h in shown]
            value = int(task.label_values[int(test.labels[i])])
            caption = (f"held-out example {i}: label {value}, {n} tokens; heads {', '.join(f'L{a}H{b}' for a, b in heads)} "
                       f"(the first is the chosen one); T1/T2 = the distance triggers, T = a counted trigger, "
                       f"@ = position")
            block = None
            if not widgets.error:
                try:
                    # Bidirectional attention has weights above the diagonal: do not grey them out.
                    props = {"maskUpperTri": model.cfg.attention_dir == "causal"}
                    block = widgets.add(_widget_html(model, task, test.tokens, test.pad_mask, heads, i), props=props)
                except ImportError as err:
                    widgets.error = f"circuitsvis is not installed ({err})"
            if block is None:
                name = f"blocks.{p.layer}.attn.hook_pattern"
                with torch.no_grad():
                    _, cache = model.run_with_cache(test.tokens[i : i + 1], test.pad_mask[i : i + 1], names_filter=[name])
                att = cache[name][0, p.head, :n, :n].double().cpu().numpy()
                toks = token_names(task, test.tokens[i, :n].tolist())
                block = f"<img alt='attention pattern' src='{attention_image(att, toks, f'L{p.layer}H{p.head}, example {i}')}'>"
            parts.append(f"<p class='caption'>{html.escape(caption)}</p>{block}")
    head = ""
    if widgets.error:
        head = (f"<p class='warn'>Interactive circuitsvis widgets are unavailable "
                f"({html.escape(widgets.error)}); static images of the chosen head are shown instead.</p>")
    return head + "\n".join(parts)

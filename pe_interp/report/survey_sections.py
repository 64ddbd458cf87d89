"""The sections of ``SURVEY.md`` (:mod:`pe_interp.report.survey`), one a probe step: exact
ablation, head patching, route shares, head types and RoPE frequency usage, each written from its
step's saved JSON alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from probes.deposit.dominance import LARGE_DROP as DEPOSIT_DROP  # the single-head deposit's bars
from probes.deposit.dominance import SMALL_DROP


def pairs_kind(step: dict[str, Any]) -> str:
    """The kind of a pair step's counterfactuals: "position" (the same tokens moved) or "content"
    (tokens changed); files from before recorded none, and were of position-only pairs."""
    return (step.get("counterfactual") or {}).get("kind", "position")


PAIR_WORDS = {
    "position": (
        "position-only",
        "the answer's token swapped with another of the prompt's items, the same tokens moved",
    ),
    "content": ("content", "the prompt's tokens changed so that the answer changes"),
}


def ablation_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    r = step["result"]
    drops = np.array(r["drops"], dtype=float)
    lo, hi = np.array(r["ci_low"], dtype=float), np.array(r["ci_high"], dtype=float)
    n_heads = drops.size
    order = np.argsort(-drops, axis=None)[:5]
    lines = [
        f"Every one of the {n_heads} heads zero-ablated alone, exactly, on {r['n_examples']} "
        f"prompts (baseline accuracy {100 * r['baseline']:.1f}%). Largest drops, in points, with "
        f"{100 * r.get('ci_level', 0.95):.0f}% bootstrap intervals:",
        "",
        "| head | drop | interval |",
        "|---|---|---|",
    ]
    for flat in order:
        layer, head = np.unravel_index(flat, drops.shape)
        lines.append(
            f"| L{layer}H{head} | {100 * drops[layer, head]:+.1f} | "
            f"[{100 * lo[layer, head]:+.1f}, {100 * hi[layer, head]:+.1f}] |"
        )
    large = int((drops >= DEPOSIT_DROP).sum())
    lines += [
        "",
        f"- Single-head deposit: {step['single']['text']}.",
        f"- Layer-0 concentration: {step['layer0']['text']}.",
        f"- Heads whose ablation costs >= {100 * DEPOSIT_DROP:.0f} points: {large} of {n_heads}; "
        f"heads that move accuracy by more than {100 * SMALL_DROP:.0f} points either way: "
        f"{int((np.abs(drops) > SMALL_DROP).sum())} of {n_heads}.",
        f"- What a {100 * DEPOSIT_DROP:.0f}-point single-head deposit would mean here: one head of "
        f"{n_heads} whose removal alone costs at least {100 * DEPOSIT_DROP:.0f} of the "
        f"{100 * r['baseline']:.0f} points the model scores, while each of the other "
        f"{n_heads - 1} moves it by at most {100 * SMALL_DROP:.0f}: position for this task routed "
        "through one head with no backup.",
    ]
    if r["baseline"] < DEPOSIT_DROP:
        lines.append(
            f"  With a baseline of {100 * r['baseline']:.1f}%, no head can cost "
            f"{100 * DEPOSIT_DROP:.0f} points: the bar cannot be met on these prompts."
        )
    if fig is not None:
        lines += ["", f"![every head's drop]({fig.name})"]
    return lines


def patching_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    r = step["result"]
    values = np.array(r["values"], dtype=float)
    order = np.argsort(-values, axis=None)[:5]
    kind, how = PAIR_WORDS[pairs_kind(step)]
    lines = [
        f"Each head's output (`hook_z`, all positions) patched from the clean prompt into its "
        f"{kind} counterfactual ({r['n_examples']} pairs: {how}). 1.0 restores the clean logit "
        "difference; top heads:",
        "",
        "| head | restored | interval |",
        "|---|---|---|",
    ]
    lo, hi = np.array(r["ci_low"], dtype=float), np.array(r["ci_high"], dtype=float)
    for flat in order:
        layer, head = np.unravel_index(flat, values.shape)
        lines.append(
            f"| L{layer}H{head} | {values[layer, head]:+.3f} | "
            f"[{lo[layer, head]:+.3f}, {hi[layer, head]:+.3f}] |"
        )
    if fig is not None:
        lines += ["", f"![every head patched]({fig.name})"]
    return lines


def routes_section(step: dict[str, Any]) -> list[str]:
    from probes.routes.shares import RouteShares

    r = RouteShares.from_dict(step["result"])
    lines = [
        f"Route shares on {r.n_examples} position-only pairs: the positional effect is "
        f"{r.effect:.3f} logits [{r.effect_ci[0]:.3f}, {r.effect_ci[1]:.3f}]; each route's share "
        "of it (the positional criterion, per query head):",
        "",
        "| route | share | interval |",
        "|---|---|---|",
    ]
    for name, share, lo, hi in r.units()[:6]:
        lines.append(f"| {name} | {100 * share:.1f}% | [{100 * lo:.1f}, {100 * hi:.1f}] |")
    lines += [
        "",
        f"- Moving every route's positions at once moves the logit difference by {r.effect:.2f}; "
        f"the counterfactual prompt itself moves it by {r.counterfactual_effect:.2f} (mean gap "
        f"between the two per pair: {r.identity_gap:.2f}). In a causal model the order of the "
        "tokens also enters through the causal mask, which no route carries; the shares are "
        "shares of what the positional encoding carries.",
    ]
    if r.screened:
        lines.append(
            f"- Screened: {int(r.measured.sum())} of {int(r.routes.sum())} routes measured "
            f"exactly; the others' estimated shares lie within ±{100 * r.unmeasured_max():.1f}%."
        )
    lines += [f"- {sentence(step['verdict'])}."]
    return lines


def head_types_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    from probes.heads.types import HEAD_TYPES, HeadTypeScores

    r = HeadTypeScores.from_dict(step["result"])
    n_layers, n_heads = r.shape
    lines = [
        f"Every head scored on {r.n_examples} prompts ({r.n_forwards} forwards). A head is of a "
        "type when its focus (the mean attention on the type's targets over the queries that have "
        "one) reaches the type's threshold; the score is TransformerLens' `detect_head` (`mul`).",
        "",
        "| type | threshold | heads of the type | top heads: score [focus] |",
        "|---|---|---|---|",
    ]
    for kind in HEAD_TYPES:
        typed = r.types()[kind]
        top = ", ".join(
            f"L{lh[0]}H{lh[1]} {v:.2f} [{float(r.focus[kind][lh]):.2f}]" for lh, v in r.top(kind, 3)
        )
        lines.append(
            f"| {kind.replace('_', '-')} | {r.thresholds[kind]:g} | "
            f"{len(typed)} of {n_layers * n_heads} | {top} |"
        )
    if fig is not None:
        lines += ["", f"![head types]({fig.name})"]
    return lines


MEASURE_WORDS = {
    "pattern": "logit terms centred along each query's row (what can shape the pattern)",
    "logit": "raw squared logit terms",
    "norm": "q/k chunk norms",
}


def frequency_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    f = step["findings"]
    low = f["low_frequency_norm"]
    band = step["result"].get("band", 0.25)
    lines = [
        f"Each head's rotated queries and keys split into RoPE's 2-D frequency chunks; the high "
        f"band is the fastest {100 * band:.0f}% of the frequencies, the low band the slowest. "
        "Barbero et al. (2024) found on Gemma 7B that (1) most of the q/k norm sits in the lowest "
        "frequencies and (2) positional heads use the highest. Here, with k of n heads and 95% "
        "Wilson intervals:",
        "",
        f"1. Low band holds more q/k norm than the high band: **{low['k']} of {low['n']}** heads "
        f"[{100 * low['interval'][0]:.0f}%, {100 * low['interval'][1]:.0f}%].",
        f"2. Positional heads ({step['positional_heads_are']}: "
        f"{', '.join(f'L{a}H{b}' for a, b in step['positional_heads']) or 'none'}) whose high band "
        "holds more than their low band, by each measure (every head of the model alongside):",
        "",
        "| measure | positional heads | every head |",
        "|---|---|---|",
    ]
    for measure, words in MEASURE_WORDS.items():
        cells = []
        for who in ("positional", "every"):
            r = f.get(f"high_{measure}_{who}")
            cells.append(
                "none"
                if r is None
                else f"{r['k']} of {r['n']} [{100 * r['interval'][0]:.0f}%, {100 * r['interval'][1]:.0f}%]"
            )
        lines.append(f"| {words} | {cells[0]} | {cells[1]} |")
    if fig is not None:
        lines += ["", f"![frequency usage]({fig.name})"]
    return lines


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:]

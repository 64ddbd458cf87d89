"""The deposit study from its committed findings (``findings/deposit-mid/*.json``, written by
the sweep: :mod:`pe_interp.sweep.findings`): per model and per condition, the rates with Wilson
intervals, the numbers behind them, the verdict, and the dynamics figure. Like the rest of the
report it only reads: every number is a statistic of the stored ablation grids.

Two properties are counted, each with its one definition:

- **single-head deposit** (:func:`probes.deposit.dominance`, the claims' C7/C8): exactly one
  head of the model costs ≥ 50 points when ablated alone, every other head moves accuracy by
  ≤ 5 points either way;
- **layer-0 concentration** (:func:`probes.deposit.layer_stats` at layer 0 with
  ``find_deposits``' thresholds, the looser criterion fixed before the study ran): layer 0's top
  head costs ≥ 20 points, ≥ 50% of layer 0's summed positive drop, and the lower end of its
  bootstrap CI lies above the runner-up's drop (no tie). 20 points is four times the "negligible"
  bar of C8 and ten standard errors of a paired accuracy difference on 1,000 examples; 50% means
  the head carries more of its layer than all the others together.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.report.figures import new_figure, save_png
from pe_interp.sweep.findings import ablation_of, layer_ablation_of
from probes.common.metrics import wilson
from probes.deposit import LARGE_DROP, SMALL_DROP, decide_single, dominance, layer_stats
from probes.routes.shares import NO_EFFECT

__all__ = [
    "ConditionRow",
    "ModelRow",
    "condition_rows",
    "markdown",
    "model_rows",
    "study_dynamics_figure",
    "update_readme",
    "verdict",
]


@dataclass(frozen=True)
class ModelRow:
    """One trained model (one seed of one condition)."""

    condition: str
    seed: int
    test_acc: float
    steps: int | None
    top: str  # "L{layer}H{head}" of the largest single-head drop in the model
    top_drop: float
    top_ci: tuple[float, float]
    runner_up: float  # the largest drop among the other heads
    share_of_model: float  # top head's share of the model's summed positive drops
    share_of_layer: float  # top head's share of its own layer's summed positive drops
    l0_top: str
    l0_top_drop: float
    l0_share: float
    layer0_drop: float | None  # all 16 heads of layer 0 ablated together
    single: bool
    top_large: bool  # the criterion's first half: the top head costs >= 50 points
    others_small: bool  # its second half: every other head within 5 points, either way
    l0_concentration: bool
    peak_l0_drop: float | None  # the largest layer-0 top-head drop seen during training
    peak_step: int | None
    wall_s: float | None
    native_bf16: bool | None
    decided: str = ""  # the single-head deposit decided on its intervals: yes, no or undecided
    positional: str = (
        ""  # the positional deposit (routes probe): yes, no or undecided; "" not measured
    )
    # the positional effect through the encoding's routes over the whole counterfactual effect (the
    # rest comes in through a causal model's order itself; None: not measured, or no effect to divide)
    encoding_part: float | None = None


@dataclass(frozen=True)
class ConditionRow:
    condition: str
    n: int
    acc_mean: float
    acc_sd: float
    k_single: int
    single_ci: tuple[float, float]
    k_concentration: int
    concentration_ci: tuple[float, float]
    median_top_drop: float
    median_share_of_model: float
    median_share_of_layer: float
    median_layer0_drop: float | None
    tops: tuple[str, ...]
    k_positional: int = 0
    n_positional: int = 0  # models whose positional criterion was measured
    median_encoding_part: float | None = None


def _top_of_layer(drops: np.ndarray) -> tuple[int, float, float]:
    head = int(np.nanargmax(drops))
    pos = np.clip(np.nan_to_num(drops), 0.0, None)
    return head, float(drops[head]), float(pos[head] / pos.sum()) if pos.sum() > 0 else 0.0


def model_rows(findings: list[dict[str, Any]]) -> list[ModelRow]:
    rows = []
    for f in findings:
        a = ablation_of(f)
        if a is None:
            continue
        d = dominance(a)
        l0 = layer_stats(a.drops[0], a.ci_low[0], a.ci_high[0], layer=0)
        _, _, share_layer = _top_of_layer(a.drops[d.layer])
        layers = layer_ablation_of(f)
        peak = _peak(f.get("dynamics") or [])
        machine = f.get("machine") or {}
        rows.append(
            ModelRow(
                condition=f["condition"],
                seed=int(f["seed"]),
                test_acc=float(f["test_acc"]),
                steps=(f.get("final") or {}).get("step"),
                top=f"L{d.layer}H{d.head}",
                top_drop=d.drop,
                top_ci=(float(a.ci_low[d.layer, d.head]), float(a.ci_high[d.layer, d.head])),
                runner_up=d.runner_up,
                share_of_model=d.share,
                share_of_layer=share_layer,
                l0_top=f"L0H{l0.top_head}",
                l0_top_drop=l0.top_drop,
                l0_share=l0.share,
                layer0_drop=None if layers is None else float(layers.drops[0]),
                single=d.single,
                top_large=d.top_large,
                others_small=d.others_small,
                l0_concentration=l0.is_deposit,
                peak_l0_drop=peak[0],
                peak_step=peak[1],
                wall_s=sum((f.get("seconds") or {}).values()) or None,
                native_bf16=machine.get("cpu_bf16"),
                decided=decide_single(a).verdict if not np.isnan(a.ci_low).any() else "",
                positional=(f.get("routes") or {}).get("verdict", ""),
                encoding_part=_encoding_part(f.get("routes")),
            )
        )
    return rows


def _encoding_part(routes: dict[str, Any] | None) -> float | None:
    """``effect / counterfactual_effect`` of the routes probe: how much of what the position-only
    counterfactual does to the logit difference the encoding's positions carry."""
    effect, whole = (routes or {}).get("effect"), (routes or {}).get("counterfactual_effect")
    if (
        effect is None or whole is None or not abs(whole) >= NO_EFFECT
    ):  # no effect to divide (or NaN)
        return None
    return float(effect) / float(whole)


def _peak(dynamics: list[dict[str, Any]]) -> tuple[float | None, int | None]:
    best: tuple[float | None, int | None] = (None, None)
    for r in dynamics:
        if r.get("layer") != 0:
            continue
        top = max((x for x in r["drops"] if x is not None), default=None)
        if top is not None and (best[0] is None or top > best[0]):
            best = (float(top), int(r["step"]))
    return best


def condition_rows(models: list[ModelRow], order: list[str] | None = None) -> list[ConditionRow]:
    groups: dict[str, list[ModelRow]] = {}
    for m in models:
        groups.setdefault(m.condition, []).append(m)
    rank = {c: i for i, c in enumerate(order or [])}
    out = []
    for cond in sorted(groups, key=lambda c: (c != "base", rank.get(c, len(rank)), c)):
        ms = sorted(groups[cond], key=lambda m: m.seed)
        accs = [m.test_acc for m in ms]
        k1, k2 = sum(m.single for m in ms), sum(m.l0_concentration for m in ms)
        l0 = [m.layer0_drop for m in ms if m.layer0_drop is not None]
        out.append(
            ConditionRow(
                condition=cond,
                n=len(ms),
                acc_mean=statistics.fmean(accs),
                acc_sd=statistics.stdev(accs) if len(accs) > 1 else 0.0,
                k_single=k1,
                single_ci=wilson(k1, len(ms)),
                k_concentration=k2,
                concentration_ci=wilson(k2, len(ms)),
                median_top_drop=statistics.median(m.top_drop for m in ms),
                median_share_of_model=statistics.median(m.share_of_model for m in ms),
                median_share_of_layer=statistics.median(m.share_of_layer for m in ms),
                median_layer0_drop=statistics.median(l0) if l0 else None,
                tops=tuple(m.top for m in ms),
                k_positional=sum(m.positional == "yes" for m in ms),
                n_positional=sum(bool(m.positional) for m in ms),
                median_encoding_part=_median([m.encoding_part for m in ms]),
            )
        )
    return out


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}"


def _rate(k: int, n: int, ci: tuple[float, float]) -> str:
    return f"{k} of {n} [{_pct(ci[0], 0)}, {_pct(ci[1], 0)}]%"


def verdict(conds: list[ConditionRow], models: list[ModelRow] | None = None) -> str:
    """The study's rates in one paragraph; with the models, also how often each half of the
    single-head criterion holds on its own (which half a null fails on)."""
    n = sum(c.n for c in conds)
    k = sum(c.k_single for c in conds)
    where = [c.condition for c in conds if c.k_single]
    kc = sum(c.k_concentration for c in conds)
    lo, hi = wilson(k, n) if n else (math.nan, math.nan)
    text = (
        f"Single-head deposit in {k} of {n} models (Wilson 95% interval {_pct(lo, 0)}–{_pct(hi, 0)}%)"
        + (f", in: {', '.join(where)}." if where else ", in no condition.")
        + f" Layer-0 concentration (the looser criterion) in {kc} of {n}."
    )
    npos = sum(c.n_positional for c in conds)
    if npos:
        kp = sum(c.k_positional for c in conds)
        plo, phi = wilson(kp, npos)
        text += (
            f" Positional deposit (one route carries ≥ 50% of the positional effect, every other ≤ 5%) in {kp} "
            f"of the {npos} models it was measured on (Wilson 95% {_pct(plo, 0)}–{_pct(phi, 0)}%)."
        )
    if models:
        big = max(models, key=lambda m: m.top_drop)
        text += (
            f" The criterion's two halves alone: a head costing ≥ {LARGE_DROP * 100:.0f} points in "
            f"{sum(m.top_large for m in models)} of {len(models)} (the largest single-head drop: {big.top} "
            f"{_pct(big.top_drop)} points, {big.condition} seed {big.seed}); every other head within "
            f"{SMALL_DROP * 100:.0f} points in {sum(m.others_small for m in models)} of {len(models)}."
        )
        decided = [m.decided for m in models if m.decided]
        if decided:
            text += (
                f" Decided on the bootstrap intervals: yes in {decided.count('yes')}, no in {decided.count('no')}, "
                f"undecided in {decided.count('undecided')} of {len(decided)}."
            )
    return text


TABLE_HEAD = (
    "| condition | seeds | held-out acc % | single-head deposit, k of n [95% CI] | layer-0 concentration, "
    "k of n [95% CI] | median top-head drop (pts) | median top share of model / of its layer % | "
    "median all-of-layer-0 drop (pts) | top head per seed |\n|---|---|---|---|---|---|---|---|---|"
)


def markdown(conds: list[ConditionRow], models: list[ModelRow]) -> str:
    """The condition table, the verdict and the per-model table, in Markdown."""
    positional = any(c.n_positional for c in conds)  # a column only where some model was measured
    head = (
        TABLE_HEAD
        if not positional
        else TABLE_HEAD.replace(
            "k of n [95% CI] | median top-head",
            "k of n [95% CI] | positional deposit, k of n measured [95% CI] | median "
            "positional effect through the encoding, % of all | median top-head",
            1,
        ).replace(
            "|---|---|---|---|---|---|---|---|---|", "|---|---|---|---|---|---|---|---|---|---|---|"
        )
    )
    lines = [head]
    for c in conds:
        pos = (
            "—"
            if not c.n_positional
            else _rate(c.k_positional, c.n_positional, wilson(c.k_positional, c.n_positional))
        )
        lines.append(
            f"| {c.condition} | {c.n} | {_pct(c.acc_mean)} ± {_pct(c.acc_sd)} | "
            f"{_rate(c.k_single, c.n, c.single_ci)} | {_rate(c.k_concentration, c.n, c.concentration_ci)} | "
            + (f"{pos} | {_pct(c.median_encoding_part, 0)} | " if positional else "")
            + f"{_pct(c.median_top_drop)} | {_pct(c.median_share_of_model, 0)} / {_pct(c.median_share_of_layer, 0)} | "
            f"{_pct(c.median_layer0_drop)} | {', '.join(c.tops)} |"
        )
    lines += [
        "",
        verdict(conds, models),
        "",
        "Per model:",
        "",
        "| condition | seed | acc % | steps | top head | drop [95% CI] (pts) | runner-up | share of model / layer % | "
        "layer-0 top (pts, share %) | all of layer 0 (pts) | peak layer-0 top in training (pts @ step) | "
        "single | L0 conc. | wall (min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in models:
        peak = "—" if m.peak_l0_drop is None else f"{_pct(m.peak_l0_drop)} @ {m.peak_step}"
        lines.append(
            f"| {m.condition} | {m.seed} | {_pct(m.test_acc)} | {m.steps} | {m.top} | {_pct(m.top_drop)} "
            f"[{_pct(m.top_ci[0])}, {_pct(m.top_ci[1])}] | {_pct(m.runner_up)} | {_pct(m.share_of_model, 0)} / "
            f"{_pct(m.share_of_layer, 0)} | {m.l0_top} {_pct(m.l0_top_drop)}, {_pct(m.l0_share, 0)} | "
            f"{_pct(m.layer0_drop)} | {peak} | {'yes' if m.single else 'no'} | {'yes' if m.l0_concentration else 'no'} | "
            f"{'—' if m.wall_s is None else f'{m.wall_s / 60:.0f}'} |"
        )
    return "\n".join(lines) + "\n"


def study_dynamics_figure(
    findings: list[dict[str, Any]], path: str | Path, order: list[str] | None = None
) -> Path | None:
    """Layer 0's top-head drop over training, one panel per condition, one line per seed (the
    runner-up dashed), on the held-out probe examples of the dynamics callback."""
    by_cond: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        if any(r.get("layer") == 0 for r in f.get("dynamics") or []):
            by_cond.setdefault(f["condition"], []).append(f)
    if not by_cond:
        return None
    rank = {c: i for i, c in enumerate(order or [])}
    conds = sorted(by_cond, key=lambda c: (c != "base", rank.get(c, len(rank)), c))
    cols = min(3, len(conds))
    rows = math.ceil(len(conds) / cols)
    fig = new_figure(4.2 * cols, 3.0 * rows)
    for i, cond in enumerate(conds):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, f in enumerate(sorted(by_cond[cond], key=lambda f: f["seed"])):
            recs = sorted(
                (r for r in f["dynamics"] if r.get("layer") == 0), key=lambda r: r["step"]
            )
            steps = [r["step"] for r in recs]
            d = np.array(
                [[np.nan if x is None else x for x in r["drops"]] for r in recs], dtype=float
            )
            srt = -np.sort(-np.nan_to_num(d, nan=-np.inf), axis=1)
            color = f"C{j % 10}"
            ax.plot(steps, 100 * srt[:, 0], color=color, lw=1.3, label=f"seed {f['seed']}")
            ax.plot(steps, 100 * srt[:, 1], color=color, lw=0.8, ls="--")
        ax.set_title(cond if len(cond) < 48 else cond[:45] + "…", fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("layer-0 drop (pts)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(
        "Layer 0 during training: top head (solid), runner-up (dashed); zero-ablation on held-out examples",
        fontsize=9,
    )
    return save_png(fig, path)


BEGIN, END = "<!-- study:{name} begin -->", "<!-- study:{name} end -->"


def update_readme(readme: str | Path, name: str, block: str) -> bool:
    """Replace the text between ``<!-- study:NAME begin -->`` and ``<!-- study:NAME end -->`` in
    ``readme`` with ``block``; False (nothing written) when the markers are not there."""
    readme = Path(readme)
    text = readme.read_text()
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{block.rstrip()}\n{end}{tail}")
    return True


def to_json(conds: list[ConditionRow], models: list[ModelRow]) -> str:
    return json.dumps(
        {
            "conditions": [asdict(c) for c in conds],
            "models": [asdict(m) for m in models],
            "verdict": verdict(conds, models),
        },
        indent=1,
        default=float,
    )

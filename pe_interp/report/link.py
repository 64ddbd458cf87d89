"""The link between concentration and generalisation (issue 23): Spearman's rho with a bootstrap.

:func:`spearman` (ties share their mean rank) and :func:`spearman_ci` (percentile bootstrap over
pairs), the pairs of a task's models that learned it (:func:`link_pairs`), the table of every
concentration measure against every generalisation measure (:func:`link_table`) and its scatter
figure (:func:`link_scatter`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pe_interp.report.data import TASK_TITLES, task_order
from pe_interp.report.model_points import CONCENTRATION, MEASURES, ModelPoint
from pe_interp.report.table import Table

__all__ = [
    "CI",
    "N_BOOTSTRAP",
    "link_pairs",
    "link_scatter",
    "link_table",
    "spearman",
    "spearman_ci",
]


N_BOOTSTRAP, CI = 2000, 0.95


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_ci(
    x: np.ndarray, y: np.ndarray, n_bootstrap: int = N_BOOTSTRAP, ci: float = CI, seed: int = 0
) -> tuple[float, float, float]:
    """(rho, low, high): Spearman's rho and a percentile bootstrap interval over pairs."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = spearman(x, y)
    rng = np.random.default_rng(seed)
    reps = [
        spearman(x[i], y[i]) for i in (rng.integers(0, len(x), len(x)) for _ in range(n_bootstrap))
    ]
    reps = np.array([r for r in reps if not math.isnan(r)])
    if len(x) < 4 or len(reps) < n_bootstrap // 2:
        return rho, math.nan, math.nan
    a = (1 - ci) / 2
    return rho, float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


def link_pairs(
    points: list[ModelPoint], task: str, conc: str, measure: str
) -> list[tuple[float, float, ModelPoint]]:
    out = []
    for p in points:
        if p.cell.task != task or p.conc is None or not p.room:
            continue
        x, y = p.conc.value(conc), p.measure(measure)
        if not (math.isnan(x) or math.isnan(y)):
            out.append((x, y, p))
    return out


def _link_row(
    task: str, group: str, measure: str, conc: str, pairs: list
) -> tuple[list[str], dict[str, Any]]:
    x, y = np.array([a for a, _, _ in pairs]), np.array([b for _, b, _ in pairs])
    rho, lo, hi = spearman_ci(x, y)
    settings = len({(p.source, p.cell.label) for _, _, p in pairs})
    if math.isnan(lo):
        verdict = "not measurable (too few models, or no spread)"
    elif lo > 0 or hi < 0:
        verdict = f"{'positive' if rho > 0 else 'negative'} (the interval excludes 0)"
    else:
        verdict = "none detected (the interval includes 0)"
    row = [
        TASK_TITLES.get(task, task),
        group,
        measure,
        conc,
        f"{len(pairs)} ({settings} settings)",
        "—" if math.isnan(rho) else f"{rho:+.2f}",
        "—" if math.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}]",
        verdict,
    ]
    record = {
        "task": task,
        "group": group,
        "measure": measure,
        "concentration": conc,
        "n": len(pairs),
        "rho": rho,
        "ci": [lo, hi],
        "points": [[a, b, p.source, p.cell.label, p.cell.seed] for a, b, p in pairs],
    }
    return row, record


def link_table(points: list[ModelPoint]) -> Table:
    """Per task, per group of models (each source alone, then all together when there are
    several), per generalisation and concentration measure: Spearman's rho and its interval."""
    rows, records = [], []
    for task in task_order([p.cell for p in points]):
        sources = sorted({p.source for p in points if p.cell.task == task})
        groups = [(s, [p for p in points if p.source == s]) for s in sources]
        if len(sources) > 1:
            groups.append(("all", points))
        before = len(rows)
        for group, members in groups:
            for measure in MEASURES:
                for conc in CONCENTRATION:
                    pairs = link_pairs(members, task, conc, measure)
                    if len(pairs) >= 4:
                        row, record = _link_row(task, group, measure, conc, pairs)
                        rows.append(row)
                        records.append(record)
        if len(rows) == before:  # say so, rather than leave the task out
            mine = [p for p in points if p.cell.task == task]
            learned = sum(p.room for p in mine)
            rows.append(
                [
                    TASK_TITLES.get(task, task),
                    ", ".join(sources),
                    "—",
                    "—",
                    f"{learned} of {len(mine)} learned",
                    "—",
                    "—",
                    "not measured: fewer than 4 models that learned the task (in-range accuracy ≥ 50%) "
                    "have both measures",
                ]
            )
    notes = [
        f"Spearman's rank correlation over models that learned their task (in-range accuracy ≥ 50%), with a "
        f"{int(100 * CI)}% percentile bootstrap interval over models ({N_BOOTSTRAP} resamples, seed 0). "
        "Retention: accuracy on the longer inputs divided by in-range accuracy on the same stream; "
        "`translated`: mean over the primary family's extras (tasks 1 and 3: shift; task 2: length); `2x "
        "length`: the sides condition at twice the training length (task 2: length). Encodings whose "
        "parameters have one entry per position are not evaluated beyond n_ctx and are not in this "
        "table. Across encodings, a correlation can reflect the encodings rather than concentration."
    ]
    return Table(
        "link",
        "Does concentration predict length generalisation?",
        [
            "task",
            "models",
            "generalisation",
            "concentration",
            "n",
            "Spearman ρ",
            "95% CI",
            "verdict",
        ],
        rows,
        records,
        notes,
    )


def link_scatter(link: Table, task: str = "distance") -> str | None:
    """Retention on translated inputs against each concentration measure, one panel each, from the
    points stored in the link table's records."""
    from pe_interp.report.figures import new_figure, to_data_uri

    panels = [r for r in link.records if r["task"] == task and r["measure"] == MEASURES[0]]
    groups = {r["group"] for r in panels}
    panels = [r for r in panels if r["group"] == ("all" if "all" in groups else r["group"])]
    if not panels or len({r["group"] for r in panels}) > 1:
        return None
    fig = new_figure(3.0 * len(panels) + 1.8, 3.2)
    labels = sorted({pt[3].split(" [")[0] for r in panels for pt in r["points"]})
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    markers = {"quick": "o", "mid": "^"}
    for i, r in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for x, y, source, label, _seed in r["points"]:
            lab = label.split(" [")[0]
            ax.scatter(
                x,
                y,
                color=colors[lab],
                marker=markers.get(source, "s"),
                s=28,
                alpha=0.85,
                label=f"{lab} ({source})",
            )
        lo, hi = r["ci"]
        ci = "" if lo is None or math.isnan(lo) else f" [{lo:+.2f}, {hi:+.2f}]"
        ax.set_title(f"ρ = {r['rho']:+.2f}{ci}, n = {r['n']}", fontsize=8)
        ax.set_xlabel(r["concentration"])
        if i == 0:
            ax.set_ylabel(MEASURES[0])
        ax.axhline(1.0, color="#999", lw=0.6, ls=":")
    seen: dict[str, Any] = {}
    for ax in fig.axes:
        for h, n in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(n, h)
    fig.legend(list(seen.values()), list(seen.keys()), loc="outside right center", fontsize=7)
    return to_data_uri(fig)

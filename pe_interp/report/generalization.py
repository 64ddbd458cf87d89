"""Length generalisation, concentration, and the link between them (issue 23), from stored results.

Per model it reads what the probes stored in the run directory: the single-head ablation grid
(the cell's ``ablation`` record), every layer ablated whole (``layer_ablation.json``), the
positional scores, and ``generalization.json``. Nothing here runs a model.

Concentration of a model (:func:`concentration`), all on held-out data:

- the **top layer-0 head**'s accuracy drop when ablated alone, and its **share** of layer 0's
  summed positive single-head drops;
- the **layer-0 cost**: the drop with all of layer 0's heads ablated together;
- the **positional score** of that head (:class:`probes.PositionalScores`);
- whether the model has a **single-head deposit** (:func:`pe_interp.report.data.dominance`, the
  project's one definition: exactly one head of the model ≥ 50 points, every other ≤ 5).

Generalisation of a model (:data:`MEASURES`): accuracy on the primary family's longer inputs
(task 1 and 3: the translated ``shift`` conditions; task 2: ``length``), averaged over its
extras, and accuracy at twice the training length (``sides``; task 2: ``length``), each divided
by the model's in-range accuracy on the same stream (*retention*: 1 = nothing lost), so that a
model is not credited for generalising merely by being accurate.

The link (:func:`link_table`): Spearman's rank correlation between each concentration measure
and each generalisation measure over the models that learned their task (in-range accuracy ≥ 50%,
:attr:`~pe_interp.report.data.Dominance.room`), with a percentile bootstrap interval over models.
These choices were fixed before any model was scored.

This module holds the tables of generalisation and concentration by setting; the per-model points
are in :mod:`pe_interp.report.model_points`, the link in :mod:`pe_interp.report.link` (all
importable from here).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from pe_interp.report.data import TASK_TITLES, label_order, task_order
from pe_interp.report.link import link_scatter, link_table, spearman, spearman_ci
from pe_interp.report.model_points import (
    CONCENTRATION,
    MEASURES,
    Concentration,
    ModelPoint,
    concentration,
    layer0_cost,
    load_points,
    points_from,
)
from pe_interp.report.table import Table
from probes.common.metrics import wilson
from probes.generalization import TRAINED


def _pm(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return "—"
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{scale * statistics.fmean(v):.{digits}f} ± {scale * sd:.{digits}f}"


def _rate(k: int, n: int) -> str:
    """``k of n`` with its 95% Wilson interval."""
    lo, hi = wilson(k, n) if n else (math.nan, math.nan)
    return f"{k} of {n} [{100 * lo:.0f}, {100 * hi:.0f}]%"


def _settings(points: list[ModelPoint]) -> list[tuple[str, str]]:
    """(source, label) of every setting, sources in order of appearance, labels in table order."""
    order = label_order([p.cell for p in points])
    sources = list(dict.fromkeys(p.source for p in points))
    present = {(p.source, p.cell.label) for p in points}
    return [(s, lab) for s in sources for lab in order if (s, lab) in present]


def _columns(points: list[ModelPoint]) -> list[tuple[str, int]]:
    """The conditions a task's table shows: the trained one, every extra of the primary family, and
    the largest extra of each other family."""
    gens = [p.gen for p in points if p.gen is not None]
    if not gens:
        return []
    g = gens[0]
    families = g.families
    out = [(TRAINED, 0)] + [(c.family, c.extra) for c in g.conditions if c.family == families[0]]
    for f in families[1:]:
        out.append((f, max(c.extra for c in g.conditions if c.family == f)))
    return out


def generalization_tables(points: list[ModelPoint]) -> list[Table]:
    """One table per task: accuracy (%) per condition, mean ± std over seeds, per encoding."""
    tables = []
    cells = [p.cell for p in points]
    for task in task_order(cells):
        pts = [p for p in points if p.cell.task == task and p.gen is not None]
        cols = _columns(pts)
        if not cols:
            continue
        g0 = pts[0].gen
        head = [
            f"{f} +{e}" if f != TRAINED else f"in range (≤ {g0.trained.max_len})" for f, e in cols
        ]
        rows, records = [], []
        for source, label in _settings(pts):
            group = sorted(
                (p for p in pts if (p.source, p.cell.label) == (source, label)),
                key=lambda p: p.cell.seed,
            )
            row = [label, group[0].source, str(len(group))]
            rec: dict[str, Any] = {
                "task": task,
                "label": label,
                "source": group[0].source,
                "seeds": [p.cell.seed for p in group],
            }
            for (f, e), name in zip(cols, head):
                accs = [p.gen.condition(f, e).accuracy for p in group]
                row.append(_pm(accs))
                rec[name] = accs
            unrepresentable = any(p.gen.unrepresentable for p in group)
            row.append(
                "not evaluated beyond n_ctx (a trained parameter per position)"
                if unrepresentable
                else ""
            )
            rows.append(row)
            records.append(rec)
        conds = {(c.family, c.extra): c for c in g0.conditions}
        base = conds[(TRAINED, 0)]
        notes = [
            f"Chance {100 * base.chance:.2f}%, length-only ceiling {100 * base.length_only:.2f}% "
            "(exact, of the trained task; the same for every condition"
            + (
                ""
                if all(abs(c.length_only - base.length_only) < 1e-12 for c in g0.conditions)
                else " except where the lengths change the joint law"
            )
            + "). "
            f"{g0.meta.get('n', '?')} fresh rows per condition per model, none of them a training row. "
            "`shift +k`: k more fillers before the decisive tokens (translated by k); `sides +k`: k/2 "
            "before and k/2 after; `right +k`: k after; `length +k`: k more tokens, counts in the trained "
            "range. `—`: not evaluated (the encoding has a trained parameter per position)."
        ]
        tables.append(
            Table(
                f"generalization-{task}",
                f"Length generalisation: {TASK_TITLES.get(task, task)}",
                ["encoding", "source", "seeds", *head, "note"],
                rows,
                records,
                notes,
            )
        )
    return tables


_CONCENTRATION_COLS = [
    "task",
    "encoding",
    "source",
    "seeds",
    "acc %",
    "single-head deposit",
    "top head (drop, pts)",
    "top L0 drop (pts)",
    "top L0 share %",
    "L0 cost (pts)",
    "top L0 positional",
    "layer concentration",
]
_CONCENTRATION_NOTE = (
    "Drops in accuracy points on held-out data. Single-head deposit: the project's one definition "
    "(exactly one head of the model ≥ 50 points, every other ≤ 5), k of n seeds with a 95% Wilson interval. Top head: the model's "
    "most harmful head per seed (drop). Share: the top layer-0 head's part of layer 0's summed positive "
    "single-head drops. L0 cost: all of layer 0 ablated together. Positional: the top layer-0 head's "
    "positional score (split-half R² of a position-only logit template). Layer concentration: seeds with a "
    "concentrated layer, any layer (`probes.find_concentrations`: top head ≥ 20 points, ≥ 50% of its layer, "
    "CI-separated)."
)


def concentration_table(points: list[ModelPoint]) -> Table:
    """Per task and encoding: accuracy and the concentration measures, mean ± std over seeds."""
    rows, records = [], []
    cells = [p.cell for p in points]
    for task in task_order(cells):
        for source, label in _settings([p for p in points if p.cell.task == task]):
            group = sorted(
                (
                    p
                    for p in points
                    if p.cell.task == task
                    and (p.source, p.cell.label) == (source, label)
                    and p.conc
                ),
                key=lambda p: p.cell.seed,
            )
            if not group:
                continue
            row, record = _concentration_row(task, label, group)
            rows.append(row)
            records.append(record)
    return Table(
        "concentration",
        "Concentration per encoding (held-out ablation)",
        list(_CONCENTRATION_COLS),
        rows,
        records,
        [_CONCENTRATION_NOTE],
    )


def _concentration_row(
    task: str, label: str, group: list[ModelPoint]
) -> tuple[list[str], dict[str, Any]]:
    """One setting's row and record over its seeds (``group``, by seed)."""
    cs = [p.conc for p in group]
    tops = ", ".join(f"L{c.top[0]}H{c.top[1]} ({100 * c.top[2]:.1f})" for c in cs)
    flagged = sum(bool(p.cell.flagged) for p in group)
    row = [
        TASK_TITLES.get(task, task),
        label,
        group[0].source,
        str(len(group)),
        _pm([p.cell.test_acc for p in group]),
        _rate(sum(c.single for c in cs), len(cs)),
        tops,
        _pm([c.drop for c in cs]),
        _pm([c.share for c in cs]),
        _pm([c.layer0_cost for c in cs]),
        _pm([c.positional for c in cs], 1.0, 2),
        f"{flagged} of {len(group)}",
    ]
    record = {
        "task": task,
        "label": label,
        "seeds": [p.cell.seed for p in group],
        "acc": [p.cell.test_acc for p in group],
        "single": [c.single for c in cs],
        "top": [list(c.top) for c in cs],
        "top_l0_drop": [c.drop for c in cs],
        "top_l0_share": [c.share for c in cs],
        "l0_cost": [c.layer0_cost for c in cs],
        "top_l0_positional": [c.positional for c in cs],
    }
    return row, record


__all__ = [
    "CONCENTRATION",
    "MEASURES",
    "Concentration",
    "ModelPoint",
    "concentration",
    "concentration_table",
    "generalization_tables",
    "layer0_cost",
    "link_scatter",
    "link_table",
    "load_points",
    "points_from",
    "spearman",
    "spearman_ci",
]

"""The deposit study of a sweep (``grids/deposit_mid.yaml``): per condition, how often one head
carries the position, with the numbers behind it, and claims C7, C8, C14 and C16 judged per
condition by the very criteria of :mod:`pe_interp.report.claims`.

A condition is a set of settings that differ from the grid's ``base`` (the base itself is the
condition "base"); its cells are its seeds. "Single-head deposit" is the one definition of
:func:`probes.deposit.dominance` (exactly one head of the whole model with a drop ≥ 50
points, every other head within 5 points either way); the table also gives each condition's top-head drop,
runner-up drop, the top head's share of the model's summed drop, its 95% CI and its layer, so a
verdict can be read against the numbers. Nothing here computes on a model.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_interp.report.claims import Context, c7, c8, c14, c16
from pe_interp.report.data import (
    LARGE_DROP,
    SMALL_DROP,
    CellInfo,
    Dominance,
    ci_of,
    dominance,
    load_cells,
    task_baselines,
)
from pe_interp.report.summary import Table
from pe_interp.sweep.grid import condition_name
from pe_interp.util.io import read_json

__all__ = [
    "Condition",
    "StudyRow",
    "conditions",
    "group_conditions",
    "is_study",
    "rows_of",
    "study_markdown",
    "study_rows",
    "study_table",
    "study_verdict",
]

STUDY_CLAIMS = (c7, c8, c14, c16)


@dataclass(frozen=True)
class Condition:
    name: str  # "base", or "key=value, ..." of the settings that differ from the base
    changes: dict[str, Any]
    cells: tuple[CellInfo, ...]


@dataclass(frozen=True)
class StudyRow:
    condition: str
    task: str
    n: int
    acc_mean: float
    acc_std: float
    n_room: int  # seeds whose baseline leaves room for a 50-point drop
    n_single: int  # of those, seeds with a single-head deposit
    top: tuple[str, ...]  # per seed: "L{l}H{h}"
    top_drop: tuple[float, ...]
    runner_up: tuple[float, ...]
    share: tuple[float, ...]
    top_ci: tuple[tuple[float, float] | None, ...]
    flagged: int  # seeds with a layer concentration (probes.deposit.find_deposits flags a layer)
    claims: dict[str, str]  # claim id -> status (task-1 conditions)
    evidence: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def conditions(sweep_dir: str | Path) -> list[Condition]:
    """The finished cells of a sweep, grouped by how their settings differ from the grid's base
    (in the grid's variant order where ``grid.json`` is present)."""
    sweep_dir = Path(sweep_dir)
    cells, _ = load_cells(sweep_dir)
    grid = read_json(sweep_dir / "grid.json") if (sweep_dir / "grid.json").is_file() else {}
    return group_conditions(cells, grid)


def group_conditions(cells: list[CellInfo], grid: dict[str, Any]) -> list[Condition]:
    """``cells`` grouped by how their ``params`` differ from ``grid["base"]``, in the order of
    ``grid["variants"]`` (conditions no variant names come last, by name)."""
    base = dict(grid.get("base", {}))
    groups: dict[str, list[CellInfo]] = {}
    changes: dict[str, dict[str, Any]] = {}
    for c in cells:
        name = condition_name(c.params, base)
        groups.setdefault(name, []).append(c)
        changes[name] = {k: v for k, v in sorted(c.params.items()) if base.get(k) != v} | {
            k: None for k in base if k not in c.params
        }
    order = ["base"]
    for v in grid.get("variants", []):
        order.append(condition_name({**base, **{k: x for k, x in v.items() if k != "seeds"}}, base))
    rank = {name: i for i, name in enumerate(dict.fromkeys(order))}
    return [
        Condition(n, changes[n], tuple(sorted(groups[n], key=lambda c: c.seed)))
        for n in sorted(groups, key=lambda n: (rank.get(n, len(rank)), n))
    ]


def _claims(
    cells: tuple[CellInfo, ...], baselines: dict[str, dict[str, float]]
) -> tuple[dict[str, str], dict[str, str]]:
    """C7, C8, C14, C16 on these task-1 cells, as if they were the `rope` model of a reproduction."""
    as_rope = [dataclasses.replace(c, label="rope") for c in cells if c.task == "distance"]
    if not as_rope:
        return {}, {}
    ctx = Context(cells=as_rope, acc={}, baselines=baselines, preset="study")
    claims = [f(ctx) for f in STUDY_CLAIMS]
    return {cl.id: cl.status for cl in claims}, {cl.id: cl.evidence for cl in claims}


def study_rows(sweep_dir: str | Path) -> list[StudyRow]:
    """One :class:`StudyRow` per condition of a sweep directory."""
    return rows_of(conditions(sweep_dir))


def rows_of(conds: list[Condition]) -> list[StudyRow]:
    """One :class:`StudyRow` per condition: the dominance of each seed's ablation grid, and the
    study claims on the condition's task-1 cells."""
    baselines = task_baselines([c for cond in conds for c in cond.cells])
    rows = []
    for cond in conds:
        ablated = [c for c in cond.cells if c.ablation is not None]
        doms: list[tuple[CellInfo, Dominance]] = [(c, dominance(c.ablation)) for c in ablated]
        room = [(c, d) for c, d in doms if d.room]
        accs = [c.test_acc for c in cond.cells]
        status, evidence = _claims(tuple(ablated), baselines)
        rows.append(
            StudyRow(
                condition=cond.name,
                task=cond.cells[0].task,
                n=len(cond.cells),
                acc_mean=statistics.fmean(accs),
                acc_std=statistics.stdev(accs) if len(accs) > 1 else 0.0,
                n_room=len(room),
                n_single=sum(d.single for _, d in room),
                top=tuple(f"L{d.layer}H{d.head}" for _, d in doms),
                top_drop=tuple(d.drop for _, d in doms),
                runner_up=tuple(d.runner_up for _, d in doms),
                share=tuple(d.share for _, d in doms),
                top_ci=tuple(ci_of(c.ablation, d.layer, d.head) for c, d in doms),
                flagged=sum(bool(c.flagged) for c in ablated),
                claims=status,
                evidence=evidence,
            )
        )
    return rows


def _mean_pts(xs: tuple[float, ...]) -> str:
    xs = tuple(x for x in xs if not math.isnan(x))
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{100 * xs[0]:.1f}"
    return f"{100 * statistics.fmean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"


STUDY_COLUMNS = [
    "condition",
    "task",
    "seeds",
    "held-out acc %",
    "single-head deposit (of seeds with room)",
    "top head per seed",
    "top drop (pts)",
    "runner-up drop (pts)",
    "top share %",
    "top CI (pts)",
    "layer concentration",
    "C7",
    "C8",
    "C14",
    "C16",
]


def study_verdict(rows: list[StudyRow]) -> str:
    """One sentence: how many task-1 models have a single-head deposit, and in which conditions."""
    total_room = sum(r.n_room for r in rows if r.task == "distance")
    total_single = sum(r.n_single for r in rows if r.task == "distance")
    with_deposit = [r.condition for r in rows if r.n_single]
    return (
        f"Single-head deposit (exactly one head with a drop ≥ {100 * LARGE_DROP:.0f} points, every "
        f"other within {100 * SMALL_DROP:.0f} either way): {total_single} of {total_room} task-1 models with room for such "
        "a drop, " + (f"in: {', '.join(with_deposit)}." if with_deposit else "in no condition.")
    )


def study_table(sweep_dir: str | Path, rows: list[StudyRow] | None = None) -> Table:
    """The study as a report :class:`~pe_interp.report.summary.Table` (summary.md, summary.json and
    report.html), its verdict as the table's note."""
    rows = study_rows(sweep_dir) if rows is None else rows
    body = []
    for r in rows:
        cis = "; ".join(
            "n/a" if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" for ci in r.top_ci
        )
        body.append(
            [
                r.condition,
                r.task,
                str(r.n),
                f"{100 * r.acc_mean:.1f} ± {100 * r.acc_std:.1f}",
                f"{r.n_single}/{r.n_room}",
                ", ".join(r.top),
                _mean_pts(r.top_drop),
                _mean_pts(r.runner_up),
                _mean_pts(r.share),
                cis,
                f"{r.flagged}/{len(r.top)}",
                *(r.claims.get(k, "—") for k in ("C7", "C8", "C14", "C16")),
            ]
        )
    return Table(
        key="study",
        title="The deposit study, by condition",
        columns=STUDY_COLUMNS,
        rows=body,
        records=[r.to_dict() for r in rows],
        notes=[study_verdict(rows)],
    )


def is_study(sweep_dir: str | Path) -> bool:
    """Whether a sweep directory holds a study: a grid with variants beyond its base."""
    path = Path(sweep_dir) / "grid.json"
    grid = read_json(path) if path.is_file() else {}
    return isinstance(grid, dict) and len([v for v in grid.get("variants", []) if v]) > 0


def study_markdown(sweep_dir: str | Path, rows: list[StudyRow] | None = None) -> str:
    """The study's table and its verdict, in Markdown."""
    t = study_table(sweep_dir, rows)
    return t.markdown() + "\n" + t.notes[0] + "\n"

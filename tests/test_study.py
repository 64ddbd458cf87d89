"""The deposit study by condition (``pe_interp.report.study``) on synthetic cells: grouping by the
settings that differ from the grid's base, the single-dominant-head rate per condition (eight
equally critical heads are not a deposit), the numbers behind it, and the table the report shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_interp.report.data import CellInfo
from pe_interp.report.study import group_conditions, rows_of, study_table, study_verdict
from probes import AblationResult

GRID = {
    "base": {"preset": "mid", "encoding": "sinusoidal+rope", "authors_quirks": True},
    "variants": [{}, {"init_mode": "normal", "seeds": [0, 1]}, {"encoding": "nope"}],
}


def drops(*entries: tuple[int, int, float], rest: float = 0.01) -> np.ndarray:
    g = np.full((6, 16), rest)
    for layer, head, d in entries:
        g[layer, head] = d
    return g


SINGLE = drops((0, 5, 0.60), (2, 1, 0.03))  # one head 60 points, the runner-up 3
EIGHT = drops(*[(0, h, 0.70) for h in range(8)])  # eight equally critical heads: no concentration
FLAT = drops((3, 4, 0.07))  # spread: the largest head 7 points


def cell(seed: int, grid: np.ndarray, acc: float = 0.92, **changes) -> CellInfo:
    params = {**GRID["base"], **changes}
    lo, hi = grid - 0.02, grid + 0.02
    result = AblationResult(
        acc, acc - grid, grid, lo, hi, "zero", "accuracy", True, 1000, *grid.shape
    )
    return CellInfo(
        f"c{seed}{changes}",
        str(params["encoding"]),
        "distance",
        seed,
        "multiplicative",
        params,
        {"test_acc": acc},
        Path("/nonexistent"),
        None,
        result,
    )


CELLS = [
    cell(0, SINGLE),
    cell(1, FLAT, acc=0.90),
    cell(2, SINGLE, acc=0.94),
    cell(0, EIGHT, init_mode="normal"),
    cell(1, EIGHT, init_mode="normal"),
    cell(0, FLAT, encoding="nope", acc=0.30),
]


def test_conditions_group_by_difference_from_base_in_variant_order():
    conds = group_conditions(list(reversed(CELLS)), GRID)
    assert [c.name for c in conds] == ["base", "init_mode=normal", "encoding=nope"]
    assert [[x.seed for x in c.cells] for c in conds] == [[0, 1, 2], [0, 1], [0]]
    assert conds[1].changes == {"init_mode": "normal"}


def test_rows_report_a_rate_and_the_numbers_behind_it():
    base, normal, nope = rows_of(group_conditions(CELLS, GRID))
    assert (base.n, base.n_room, base.n_single) == (3, 3, 2)
    assert base.top == ("L0H5", "L3H4", "L0H5")
    assert base.top_drop == pytest.approx((0.60, 0.07, 0.60))
    assert base.runner_up == pytest.approx((0.03, 0.01, 0.03))
    assert base.acc_mean == pytest.approx(np.mean([0.92, 0.90, 0.94]))
    assert base.acc_std == pytest.approx(np.std([0.92, 0.90, 0.94], ddof=1))
    assert base.top_ci[0] == pytest.approx((0.58, 0.62))
    # the share is the top head's part of the whole model's positive drops
    assert base.share[0] == pytest.approx(0.60 / (0.60 + 0.03 + 0.01 * 94))
    # eight heads each costing 70 points: every one is important, none dominates
    assert (normal.n_room, normal.n_single) == (2, 0) and normal.top_drop == pytest.approx(
        (0.70, 0.70)
    )
    assert normal.runner_up == pytest.approx((0.70, 0.70))
    assert (nope.n_room, nope.n_single) == (0, 0)  # at 30% there is no room for a 50-point drop


def test_table_and_verdict():
    rows = rows_of(group_conditions(CELLS, GRID))
    verdict = study_verdict(rows)
    assert "2 of 5 task-1 models" in verdict and "in: base." in verdict
    t = study_table(Path("/nonexistent"), rows)
    assert [r[0] for r in t.rows] == ["base", "init_mode=normal", "encoding=nope"]
    base_row = dict(zip(t.columns, t.rows[0]))
    assert base_row["single-head deposit (of seeds with room)"] == "2/3"
    assert (
        base_row["top drop (pts)"]
        == f"{np.mean([60, 7, 60]):.1f} ± {np.std([60, 7, 60], ddof=1):.1f}"
    )
    assert t.notes == [verdict] and "| base |" in t.markdown()
    none = study_verdict(rows[1:])
    assert "0 of 2 task-1 models" in none and "in no condition" in none

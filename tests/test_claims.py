"""The claim criteria of ``pe_interp.report.claims`` on synthetic cells: each claim is judged as
its words say (a single dominant head, many equally critical heads, every model at the ceiling,
a sanity check, a claim about a deposit when there is none)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pe_interp.report.claims import (
    CEILING,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    SANITY_CHECK,
    STATUSES,
    Context,
    evaluate_claims,
)
from pe_interp.report.data import (
    LARGE_DROP,
    SMALL_DROP,
    CellInfo,
    acc_stats,
    dominance,
)
from probes import AblationResult

N_LAYERS, N_HEADS = 2, 8
BASE = {
    "distance": {"chance": 0.0143, "length_only": 0.0537},
    "count": {"chance": 0.01, "length_only": 0.01},
}
ADDITIVE = ("sinusoidal", "learned", "t5", "alibi")


def grid(*entries: tuple[int, int, float], rest: float = 0.0) -> list[list[float]]:
    """An [N_LAYERS, N_HEADS] drop grid: ``rest`` everywhere, then ``(layer, head, drop)`` entries."""
    g = np.full((N_LAYERS, N_HEADS), rest)
    for layer, head, drop in entries:
        g[layer, head] = drop
    return g.tolist()


# (a) one layer-0 head drops 60 points, every other head <= 2 points
SINGLE_L0 = grid((0, 3, 0.60), (0, 1, 0.02), (1, 5, 0.015), rest=0.01)
# the same head in layer 1
SINGLE_L1 = grid((1, 3, 0.60), (0, 1, 0.02), rest=0.01)
# one large head, but a second one is not negligible (10 points)
TWO_HEADS = grid((0, 3, 0.60), (0, 4, 0.10), rest=0.01)
# (b) 8 equally critical heads: each drops 80 points
EIGHT = grid(*[(0, h, 0.80) for h in range(N_HEADS)], rest=0.01)
# spread, no head large
SPREAD = grid((0, 0, 0.30), (0, 1, 0.30), rest=0.02)
FLAT = grid(rest=0.01)


def cell(
    label: str, task: str, seed: int, acc: float, drops, kind: str = "multiplicative"
) -> CellInfo:
    d = np.asarray(drops, dtype=float)
    result = AblationResult(
        acc, acc - d, d, d - 0.01, d + 0.01, "zero", "accuracy", True, 1000, *d.shape
    )
    return CellInfo(
        f"{label}-{task}-{seed}",
        label,
        task,
        seed,
        kind,
        {},
        {"test_acc": acc},
        Path("/nonexistent"),
        None,
        result,
        None,
        None,
    )


def judge(cells: list[CellInfo], gradients=None) -> dict:
    ctx = Context(
        cells=cells, acc=acc_stats(cells), baselines=BASE, preset="quick", gradients=gradients
    )
    return {c.id: c for c in evaluate_claims(ctx)}


def rope(drops, acc: float = 0.92, seeds: int = 3) -> list[CellInfo]:
    return [cell("rope", "distance", s, acc, drops) for s in range(seeds)]


# ------------------------------------------------------------------------------------------------
# the one definition of a single dominant head
# ------------------------------------------------------------------------------------------------
def test_dominance_definition():
    d = dominance(cell("rope", "distance", 0, 0.92, SINGLE_L0).ablation)
    assert (d.layer, d.head, d.n_large) == (0, 3, 1) and d.single and d.room
    assert d.drop == pytest.approx(0.60) and d.runner_up == pytest.approx(0.02)
    assert 0.5 < d.share < 1.0
    eight = dominance(cell("rope", "distance", 0, 0.92, EIGHT).ablation)
    assert eight.n_large == 8 and eight.top_large and not eight.others_small and not eight.single
    two = dominance(cell("rope", "distance", 0, 0.92, TWO_HEADS).ablation)
    assert two.n_large == 1 and not two.single  # the 10-point runner-up is not negligible
    assert not dominance(cell("rope", "distance", 0, 0.92, SPREAD).ablation).single
    assert not dominance(cell("rope", "distance", 0, 0.40, FLAT).ablation).room
    assert (LARGE_DROP, SMALL_DROP) == (0.50, 0.05)


# ------------------------------------------------------------------------------------------------
# (a) a single dominant layer-0 head
# ------------------------------------------------------------------------------------------------
def test_single_dominant_layer0_head():
    claims = judge(rope(SINGLE_L0))
    for cid in ("C7", "C8", "C14", "C16"):
        assert claims[cid].status == REPRODUCED, (cid, claims[cid].evidence)
    ev = claims["C7"].evidence
    assert "3/3" in ev and "top L0H3" in ev and "runner-up 2.0 pts" in ev and "top share" in ev
    assert "weak" in claims["C16"].evidence  # 2 layers: implied by C14
    assert "weak" in claims["C14"].evidence
    assert "single-head deposit" in claims["C7"].criterion


def test_dominant_head_in_layer1_or_a_second_large_head_fails():
    claims = judge(rope(SINGLE_L1))
    assert claims["C7"].status == NOT_REPRODUCED  # the head is not in layer 0
    assert claims["C8"].status == REPRODUCED  # but the other heads are negligible
    assert claims["C14"].status == NOT_REPRODUCED and claims["C16"].status == NOT_REPRODUCED
    claims = judge(rope(TWO_HEADS))
    assert claims["C7"].status == NOT_REPRODUCED and claims["C8"].status == NOT_REPRODUCED
    assert "largest other |drop| 10.0 pts" in claims["C8"].evidence


def test_majority_of_seeds():
    claims = judge(rope(SINGLE_L0, seeds=2) + [cell("rope", "distance", 2, 0.92, EIGHT)])
    assert claims["C7"].status == REPRODUCED and "2/3" in claims["C7"].evidence
    claims = judge(
        rope(SINGLE_L0, seeds=1) + [cell("rope", "distance", s, 0.92, EIGHT) for s in (1, 2)]
    )
    assert claims["C7"].status == NOT_REPRODUCED and "1/3" in claims["C7"].evidence


# ------------------------------------------------------------------------------------------------
# (b) 8 equally critical heads: no concentration
# ------------------------------------------------------------------------------------------------
def test_eight_equally_critical_heads():
    cells = rope(EIGHT)
    cells += [
        cell(lab, "distance", s, 0.92, EIGHT, "additive") for lab in ADDITIVE for s in range(2)
    ]
    cells += [cell("nope", "distance", s, 0.92, EIGHT, "none") for s in range(2)]
    cells += [cell("rope", "count", s, 0.92, EIGHT) for s in range(2)]
    cells += [cell("decoupled_rope", "distance", s, 0.92, EIGHT) for s in range(2)]
    claims = judge(cells)
    assert claims["C7"].status == NOT_REPRODUCED, claims["C7"].evidence
    assert claims["C8"].status == NOT_REPRODUCED, claims["C8"].evidence
    # "no single-head concentration": 8 critical heads are no concentration at all
    for cid in ("C9", "C10", "C11"):
        assert claims[cid].status == REPRODUCED, (cid, claims[cid].evidence)
        assert "heads ≥ 50 pts: 8" in claims[cid].evidence
    # no deposit, nothing to locate
    assert claims["C14"].status == NOT_MEASURED and claims["C16"].status == NOT_MEASURED


def test_no_concentration_claims_fail_on_a_single_dominant_head():
    cells = [cell(lab, "distance", 0, 0.92, EIGHT, "additive") for lab in ADDITIVE]
    cells.append(cell("t5", "distance", 1, 0.92, SINGLE_L0, "additive"))  # one seed concentrates
    cells += [
        cell("nope", "distance", 0, 0.92, FLAT, "none"),
        cell("rope", "count", 0, 0.92, SINGLE_L1),
    ]
    cells.append(cell("decoupled_rope", "distance", 0, 0.92, SINGLE_L0))
    claims = judge(cells)
    for cid in ("C9", "C10", "C11"):
        assert claims[cid].status == NOT_REPRODUCED, (cid, claims[cid].evidence)


def test_no_concentration_needs_room():
    # a 40% model cannot show a 50-point drop: listed, not judged
    cells = [cell("nope", "distance", 0, 0.40, FLAT, "none"), cell("rope", "count", 0, 0.40, FLAT)]
    claims = judge(cells)
    assert claims["C9"].status == NOT_MEASURED and "not informative" in claims["C9"].evidence
    cells.append(cell("rope", "count", 1, 0.90, FLAT))
    claims = judge(cells)
    assert claims["C9"].status == REPRODUCED and "no room, not judged" in claims["C9"].evidence


def test_rope_model_without_room_is_not_judged():
    # learned the task (above the length-only ceiling) but < 50%: C7 cannot be tested
    claims = judge(rope(FLAT, acc=0.40))
    assert claims["C7"].status == NOT_MEASURED and "no room" in claims["C7"].evidence


# ------------------------------------------------------------------------------------------------
# (c) every model at the ceiling
# ------------------------------------------------------------------------------------------------
LABELS = ("nope", "sinusoidal", "learned", "t5", "alibi", "rope", "decoupled_rope")


def accuracy_cells(means: dict[tuple[str, str], float]) -> list[CellInfo]:
    return [cell(lab, task, s, m, FLAT) for (lab, task), m in means.items() for s in range(2)]


def test_ceiling_leaves_orderings_not_measured():
    at_ceiling = {(lab, t): 1.0 for lab in LABELS for t in ("distance", "count")}
    claims = judge(accuracy_cells(at_ceiling))
    for cid in ("C4", "C5", "C6"):
        assert claims[cid].status == NOT_MEASURED, (cid, claims[cid].evidence)
        assert "at the ceiling" in claims[cid].evidence


def test_below_the_ceiling_the_orderings_are_judged():
    means = {(lab, t): 0.90 for lab in LABELS for t in ("distance", "count")}
    means[("nope", "count")], means[("rope", "count")], means[("alibi", "count")] = 0.95, 0.85, 0.50
    claims = judge(accuracy_cells(means))
    assert claims["C4"].status == REPRODUCED and claims["C5"].status == REPRODUCED
    assert claims["C6"].status == REPRODUCED
    means[("rope", "count")] = 0.97  # RoPE above NoPE; ALiBi no longer worst
    means[("alibi", "count")] = 0.99
    claims = judge(accuracy_cells(means))
    assert claims["C4"].status == NOT_REPRODUCED and claims["C5"].status == NOT_REPRODUCED
    # one task at the ceiling, the other measured: the measured part decides a failure
    means = {
        (lab, t): (1.0 if t == "count" else 0.90) for lab in LABELS for t in ("distance", "count")
    }
    means[("decoupled_rope", "distance")] = 0.50
    claims = judge(accuracy_cells(means))
    assert claims["C6"].status == NOT_REPRODUCED
    means[("decoupled_rope", "distance")] = 0.89
    claims = judge(accuracy_cells(means))
    assert claims["C6"].status == NOT_MEASURED and "count" in claims["C6"].evidence
    assert pytest.approx(0.98) == CEILING


# ------------------------------------------------------------------------------------------------
# (d) C17 is a sanity check; C2's NoPE half holds by construction
# ------------------------------------------------------------------------------------------------
def test_c17_is_a_sanity_check():
    assert SANITY_CHECK in STATUSES
    claims = judge([])
    assert claims["C17"].status == SANITY_CHECK, claims["C17"].evidence
    assert "by construction" in claims["C17"].criterion
    assert "1.43%" in claims["C17"].evidence and "5.37%" in claims["C17"].evidence


def test_sanity_check_is_rendered():
    from pe_interp.report.html import CSS, table_html
    from pe_interp.report.summary import claims_table

    t = claims_table(list(judge([]).values()))
    row = next(r for r in t.rows if r[0] == "C17")
    assert row[3] == "**sanity check**"
    assert "**sanity check**" in t.markdown() and "sanity check" in t.notes[0]
    assert "class='status-sanity-check'" in table_html(t, status_col="Status")
    assert ".status-sanity-check" in CSS


def test_c2_says_nope_cannot_fail():
    cells = [
        cell("nope", "distance", 0, 0.05, FLAT, "none"),
        cell("alibi", "distance", 0, 0.05, FLAT, "additive"),
    ]
    c2 = judge(cells)["C2"]
    assert c2.status == REPRODUCED
    assert "cannot fail by construction" in c2.evidence and "by construction" in c2.criterion


# ------------------------------------------------------------------------------------------------
# (e) C14 / C16 with no deposit
# ------------------------------------------------------------------------------------------------
def test_c14_without_a_deposit_is_not_measured():
    # the old criterion ("the most harmful head is in layer 0") passed here: SPREAD's top is L0H0
    claims = judge(rope(SPREAD) + [cell("nope", "distance", 0, 0.92, FLAT, "none")])
    for cid in ("C14", "C16"):
        assert claims[cid].status == NOT_MEASURED, (cid, claims[cid].evidence)
        assert "no deposit" in claims[cid].evidence
    # two 30-point heads: "every other head is negligible" fails whichever is the one
    assert claims["C8"].status == NOT_REPRODUCED
    # no head matters at all: no "one head" for C8, no deposit for C7/C14
    claims = judge(rope(FLAT))
    assert claims["C8"].status == NOT_MEASURED and "no head is singled out" in claims["C8"].evidence
    assert claims["C7"].status == NOT_REPRODUCED and claims["C14"].status == NOT_MEASURED


def test_c14_counts_only_the_seeds_with_a_deposit():
    claims = judge(
        rope(SINGLE_L0, seeds=1) + [cell("rope", "distance", s, 0.92, SPREAD) for s in (1, 2)]
    )
    assert (
        claims["C14"].status == REPRODUCED and "1/1 seeds with a deposit" in claims["C14"].evidence
    )
    assert claims["C7"].status == NOT_REPRODUCED  # the deposit itself is in a minority of seeds


# ------------------------------------------------------------------------------------------------
# C15: one criterion, the one report.gradients applies
# ------------------------------------------------------------------------------------------------
def test_c15_states_the_criterion_gradients_applies():
    from pe_interp.report import gradients

    assert gradients.threshold(128) == pytest.approx(2 / math.sqrt(128))
    assert judge([])["C15"].criterion == gradients.criterion(gradients.N_EXAMPLES)
    assert judge([])["C15"].status == NOT_MEASURED
    seeded = {
        "rope": {"values": [[[0.30, 0.10]], [[0.28, 0.1]]], "seeds": [0, 1]},
        "alibi": {"values": [[[0.09, 0.08]], [[0.10, 0.07]]], "seeds": [0, 1]},
    }
    for results, status in (
        (seeded, REPRODUCED),
        ({"rope": seeded["alibi"], "alibi": seeded["alibi"]}, NOT_REPRODUCED),
    ):
        g = gradients.judge(results, 128)
        c15 = judge([], gradients=g)["C15"]
        assert c15.status == status == g["status"]
        assert c15.criterion == g["criterion"] == gradients.criterion(128)
        assert "2/√n = 0.177" in c15.criterion

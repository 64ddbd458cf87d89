"""Ground truth (issue 36): the single_no construction, scoring probes against planted routes, and
the dynamics study's table from findings that kept every snapshot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pe_interp
from pe_interp.validate import (
    family_of,
    mirror_head,
    score_cell,
    validation_markdown,
    validation_table,
)

SILENT = [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]


@pytest.fixture(scope="module")
def single_yes(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted") / "yes"
    pe_interp.train(
        task="distance",
        encoding="rope(heads=(1,), layers=(0,))",
        preset="smoke",
        seed=0,
        out=out,
        silent_heads=SILENT,
        n_heads=4,
        progress=False,
    )
    return out


def test_the_mirrored_model_computes_the_same_function_with_two_tied_heads(single_yes, tmp_path):
    from probes import ablate_heads, dominance, positional_dominance, route_shares
    from probes.routes.shares import position_routes

    mirrored = mirror_head(single_yes, tmp_path / "no", (0, 1), (0, 2))
    a, b = pe_interp.load_run(single_yes), pe_interp.load_run(mirrored)
    assert b.model.cfg.silent_heads == tuple(p for p in a.model.cfg.silent_heads if p != (0, 2))
    assert position_routes(b.model)[1][0].tolist() == [False, True, True, False]
    test = a.test_set(200)
    with torch.no_grad():
        torch.testing.assert_close(
            a.model(test.tokens, test.pad_mask),
            b.model(test.tokens, test.pad_mask),
            rtol=1e-5,
            atol=1e-5,
        )
    # the two heads' drops and shares tie exactly, so neither criterion can pick one
    abl = ablate_heads(b.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=50)
    assert abl.drops[0, 1] == abl.drops[0, 2] and not dominance(abl).single
    p = a.task.counterfactuals(64, kind="position", seed=1)
    shares = route_shares(
        b.model,
        p.clean.tokens,
        p.corrupt.tokens,
        p.clean.labels,
        p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
        n_bootstrap=50,
    )
    assert shares.shares[0, 1] == pytest.approx(
        shares.shares[0, 2], rel=1e-3
    )  # float sums over heads
    assert positional_dominance(shares).verdict != "yes"
    with pytest.raises(ValueError, match="must be a working head and"):
        mirror_head(single_yes, tmp_path / "bad", (0, 1), (1, 1))  # another layer


def _record(family, routes, rankings, verdicts):
    return {
        "family": family,
        "routes": routes,
        "rankings": rankings,
        "verdicts": verdicts,
        "task": "distance",
        "test_acc": 0.9,
    }


def test_families_and_scores_follow_the_construction():
    one = np.zeros((2, 4), int)
    one[0, 3] = 1
    assert family_of({}, one) == "one_route" and family_of({}, one[::-1]) == "deep_route"
    assert (
        family_of({}, np.zeros((2, 4))) == "no_route"
        and family_of({"silent_heads": [[0, 0]]}, one) == "single_yes"
    )
    hit = np.zeros((2, 4))
    hit[0, 3] = 0.8
    miss = np.zeros((2, 4))
    miss[1, 0] = 0.8
    rec = _record(
        "one_route",
        one,
        {"exact ablation: top head": hit, "decomposition: most positional head": miss},
        {"positional deposit": "yes", "single-head deposit (paper)": "no"},
    )
    s = score_cell(rec)
    assert s["exact ablation: top head"] == {"named": "L0H3", "hit": True}
    assert s["decomposition: most positional head"] == {"named": "L1H0", "hit": False}
    assert s["positional deposit"]["hit"] and not s["single-head deposit (paper)"]["hit"]
    table = validation_table([rec, rec])
    assert table["exact ablation: top head"]["one_route"]["hits"] == 2
    assert table["single-head deposit (paper)"]["one_route"]["hits"] == 0
    md = validation_markdown([rec, rec], "distance")
    assert "Task `distance`:" in md and "| positional deposit | 2/2 [34–100%] |" in md


def _snap(step, drops, verdicts):
    return {
        "step": step,
        "drops": drops,
        "verdicts": {k: {"verdict": v} for k, v in verdicts.items()},
    }


def test_the_dynamics_study_counts_onset_lifetime_and_where_the_work_goes():
    from pe_interp.report.trajectories import trajectory_markdown, trajectory_rows

    no = {"single_head": "no", "layer0": "no", "positional": "no"}
    yes0 = {**no, "layer0": "yes"}
    lead = [[0.6, 0.1], [0.0, 0.0]]  # layer 0's H0 leads with 60 points
    spread = [[0.3, 0.3], [0.2, 0.1]]  # ...then its layer-0 rival and layer 1 take over
    seed0 = {
        "condition": "c",
        "seed": 0,
        "test_acc": 0.9,
        "snapshots": [
            _snap(0, [[0, 0], [0, 0]], no),
            _snap(48, lead, yes0),
            _snap(96, lead, yes0),
            _snap(144, spread, no),
        ],
    }
    seed1 = {
        "condition": "c",
        "seed": 1,
        "test_acc": 0.8,
        "snapshots": [_snap(0, [[0, 0], [0, 0]], no), _snap(48, spread, no)],
    }
    rows = trajectory_rows([seed0, seed1])
    assert rows[0]["layer0"]["k"] == 1 and rows[0]["single_head"]["k"] == 0
    s0 = rows[0]["seeds"][0]
    assert (s0["layer0"]["onset"], s0["layer0"]["last"], s0["layer0"]["lifetime"]) == (48, 96, 96)
    peak = s0["l0_peak"]
    assert (
        peak["step"] == 48
        and peak["head"] == "L0H0"
        and peak["drop"] == 0.6
        and peak["final"] == 0.3
    )
    assert peak["to_l0_others"] == pytest.approx(0.2) and peak["to_later_layers"] == pytest.approx(
        0.3
    )
    md = trajectory_markdown(rows, "findings/x")
    assert (
        "| c | 2 | 85.0 | 0 of 2 [0, 66]% | 1 of 2 [9, 91]% | 0 of 2 [0, 66]% | 48 / 96 / 96 |"
        in md
    )


def test_single_yes_implies_the_papers_verdict_only_where_accuracy_decides_it():
    from pe_interp.validate import expected

    rec = {"family": "single_yes", "blind_ceiling": 0.1542}
    assert expected("single-head deposit (paper)", {**rec, "test_acc": 0.9}) == "yes"
    assert expected("single-head deposit (paper)", {**rec, "test_acc": 0.45}) == "no"
    assert expected("single-head deposit (paper)", {**rec, "test_acc": 0.6}) is None
    assert expected("positional deposit", {**rec, "test_acc": 0.6}) == "yes"
    assert expected("layer-0 concentration", {"family": "two_routes"}) is None


def test_a_sweep_with_list_valued_settings_aggregates():
    from pe_interp.sweep import aggregate

    results = [
        {"params": {"silent_heads": [[0, 1], [1, 0]], "encoding": "rope"}, "final": {"test_acc": a}}
        for a in (0.5, 0.7)
    ]
    rows = aggregate(results, ["silent_heads", "encoding"])
    assert len(rows) == 1 and rows[0]["n_seeds"] == 2 and rows[0]["acc_mean"] == pytest.approx(0.6)
    assert rows[0]["silent_heads"] == ((0, 1), (1, 0))


def test_the_committed_single_yes_model_is_the_paper_criterions_true_positive():
    """checkpoints/planted-single-yes: every head but L0H3 silent (W_V, b_V, W_O zero), trained 30
    epochs to 97.7% held out. Ablating a silent head changes nothing, exactly; ablating L0H3 leaves
    a model blind to order. So the paper's criterion must say yes, and it does, on its intervals;
    the positional criterion too (L0H3 is the only route)."""
    from pathlib import Path

    from pe_interp.runs.checkpoint import load_run
    from probes import ablate_heads, positional_dominance, route_shares
    from probes.deposit import PAIRS_SEED_OFFSET, decide_single, dominance

    run = load_run(Path(__file__).resolve().parents[1] / "checkpoints" / "planted-single-yes")
    test = run.examples("test", 1000)
    a = ablate_heads(run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=200)
    others = np.delete(a.drops.reshape(-1), 3)
    assert (
        np.all(others == 0.0) and a.drops[0, 3] >= 0.9
    )  # 97.7% held out, down to the order-blind level
    assert dominance(a).single and decide_single(a).verdict == "yes"
    pairs = run.task.counterfactuals(
        128, kind="position", seed=run.train_cfg.seed + PAIRS_SEED_OFFSET
    )
    r = route_shares(
        run.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.clean.pad_mask,
        n_bootstrap=200,
    )
    assert positional_dominance(r).verdict == "yes" and positional_dominance(r).top == "L0H3"


def test_the_aligned_circuit_rows_can_miss():
    """A σ-aligned circuit that lacks a route, or holds a blind head of a route's layer or below
    (a head that cannot carry the planted position), scores a miss; a later-layer reader does not."""
    from pe_interp.validate import ALIGNED, ALIGNED_CLEAN, beside_routes

    routes = np.zeros((2, 8), dtype=int)
    routes[0, 3] = 1
    record = {
        "routes": routes.tolist(),
        "family": "one_route",
        "rankings": {},
        "verdicts": {},
        "aligned_circuit": {
            "recall": 1.0,
            "edges": 10,
            "total_edges": 100,
            "heads": ["L0H3", "L1H2"],
        },
    }
    assert score_cell(record)[ALIGNED_CLEAN] == {"named": "none", "hit": True}
    record["aligned_circuit"] = {
        "recall": 0.0,
        "edges": 10,
        "total_edges": 100,
        "heads": ["L0H5", "L1H2"],
    }
    scored = score_cell(record)
    assert scored[ALIGNED]["hit"] is False and scored[ALIGNED_CLEAN] == {
        "named": "L0H5",
        "hit": False,
    }
    deep = np.zeros((2, 8), dtype=bool)
    deep[1, 4] = True
    assert beside_routes(["L0H1", "L1H4", "L1H6"], deep) == ["L0H1", "L1H6"]

"""One definition of a single-head deposit everywhere (probes.deposit.dominance), the looser
layer concentration named as such, thresholds at the evaluation set's granularity, ties never
flagged, C8 two-sided, every seed counted, baselines per task configuration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pe_interp.report.data import CellInfo, cell_baselines, task_baselines
from pe_interp.report.verdict import deposit_answer, model_line
from pe_interp.sweep.aggregate import aggregate
from probes import AblationResult, dominance, find_deposits
from probes.common.metrics import wilson
from probes.deposit import layer_stats


def ablation(
    drops, n: int = 1000, baseline: float = 0.9, ci: float | None = 0.01
) -> AblationResult:
    d = np.asarray(drops, dtype=float)
    lo = np.full_like(d, np.nan) if ci is None else d - ci
    hi = np.full_like(d, np.nan) if ci is None else d + ci
    return AblationResult(baseline, baseline - d, d, lo, hi, "zero", "accuracy", True, n, *d.shape)


def grid(*entries, rest: float = 0.0, shape=(2, 4)) -> np.ndarray:
    g = np.full(shape, rest)
    for layer, head, x in entries:
        g[layer, head] = x
    return g


def k_of(n: int, k: int) -> float:
    """k examples of n as the sweep computes a drop: a difference of two means, in float64."""
    return float(
        np.mean(np.r_[np.ones(900), np.zeros(n - 900)])
        - np.mean(np.r_[np.ones(900 - k), np.zeros(n - 900 + k)])
    )


def test_float_boundaries_do_not_flip():
    fifty, five = k_of(1000, 500), k_of(1000, 50)
    assert fifty != 0.5 or five != 0.05  # the float arithmetic really misses the exact values...
    d = dominance(ablation(grid((0, 1, fifty), (1, 2, five))))
    assert d.top_large and d.others_small and d.single  # ...and the thresholds still hold exactly
    below = dominance(ablation(grid((0, 1, k_of(1000, 499)), (1, 2, five))))
    assert not below.top_large and not below.single  # one example less is not large
    over = dominance(ablation(grid((0, 1, fifty), (1, 2, k_of(1000, 51)))))
    assert not over.others_small and not over.single  # one example more is not small


def test_negligible_is_two_sided():
    up = dominance(ablation(grid((0, 1, 0.6), (1, 2, -0.06))))
    assert up.others_max_abs == pytest.approx(0.06) and not up.others_small and not up.single
    assert dominance(ablation(grid((0, 1, 0.6), (1, 2, -0.05)))).single


def test_ties_are_never_a_deposit_or_a_concentration():
    tie = dominance(ablation(grid((0, 1, 0.6), (0, 2, 0.6))))
    assert tie.n_large == 2 and not tie.single
    # a two-way tie without CIs has share 0.5 >= min_share: still not a layer concentration
    s = layer_stats(np.array([0.3, 0.3, 0.0, 0.0]), layer=0)
    assert s.share == pytest.approx(0.5) and not s.is_deposit and any("tie" in f for f in s.failed)
    report = find_deposits(ablation(grid((0, 0, 0.3), (0, 1, 0.3)), ci=None))
    assert report.deposits == ()


def test_partial_grid_is_refused_by_dominance():
    g = grid((0, 1, 0.6))
    g[1, 3] = np.nan
    with pytest.raises(ValueError, match="needs every head's drop; 1 of 8 are missing"):
        dominance(ablation(g))


def test_headline_and_claims_agree_on_the_issues_example():
    """L0H0 costs 65.2 points, the runner-up 25.8: a layer concentration, not a single-head deposit."""
    a = ablation(grid((0, 0, 0.652), (1, 1, 0.258), rest=0.01))
    report = find_deposits(a)
    assert (0, 0) in report.deposits  # the looser flag fires (layer 1 is concentrated too)...
    c = CellInfo(
        "c",
        "rope",
        "distance",
        0,
        "multiplicative",
        {},
        {"test_acc": 0.9},
        Path("/x"),
        None,
        a,
        report,
    )
    found, line = model_line("rope", [c])
    assert (
        not found and "no single-head deposit" in line and "Layer concentration in 1 of 1" in line
    )
    answer, _ = deposit_answer([c], "distance")
    assert answer.startswith("**No**")
    assert not dominance(a).single
    single = ablation(grid((0, 0, 0.652), (1, 1, 0.03), rest=0.01))
    c2 = CellInfo(
        "c2",
        "rope",
        "distance",
        0,
        "multiplicative",
        {},
        {"test_acc": 0.9},
        Path("/x"),
        None,
        single,
        find_deposits(single),
    )
    assert deposit_answer([c2], "distance")[0].startswith("**Yes**")


def test_aggregate_counts_every_seed_in_layer_0_columns():
    def result(drops, seed):
        a = ablation(drops)
        return {
            "params": {"encoding": "rope"},
            "seed": seed,
            "final": {"test_acc": 0.9},
            "ablation": {"deposits": find_deposits(a).to_dict()},
        }

    # seed 0: layer 1 is concentrated (its first flagged layer is not 0); seed 1: nothing flagged
    rows = aggregate(
        [result(grid((1, 0, 0.4), (0, 2, 0.1)), 0), result(grid((0, 3, 0.05)), 1)], ["encoding"]
    )
    assert rows[0]["l0_seeds"] == 2 and rows[0]["concentrated_seeds"] == 1
    assert rows[0]["l0_top_drop"] == pytest.approx((0.1 + 0.05) / 2)


def test_baselines_follow_each_cells_task_configuration():
    def cell(max_len):
        task = {
            "name": "distance",
            "d_vocab": 32,
            "max_between": 6,
            "max_side": 3,
            "max_len": max_len,
            "seed": 0,
        }
        return CellInfo(
            f"c{max_len}",
            "rope",
            "distance",
            0,
            "multiplicative",
            {},
            {},
            Path("/x"),
            {"task": task},
        )

    short, long = cell(16), cell(20)
    assert (
        task_baselines([short, long]) == {}
    )  # two configurations: no single baseline for the task
    assert task_baselines([short]) == {"distance": cell_baselines(short)}
    assert cell_baselines(short) != cell_baselines(long)


def test_wilson_interval():
    lo, hi = wilson(1, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.0179, 0.4042)  # the textbook values
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 0) != wilson(0, 0)  # nan for n = 0
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson(3, 2)
    assert json.dumps(wilson(3, 7))


def test_the_layer_flag_is_called_a_concentration():
    """``find_concentrations`` is ``find_deposits`` under the one vocabulary's name (issue 21):
    the same objects, and the report's flags read as concentrations."""
    import probes

    assert probes.find_concentrations is probes.find_deposits
    assert (
        probes.ConcentrationReport is probes.DepositReport
        and probes.LayerConcentration is probes.LayerDeposit
    )
    report = probes.find_concentrations(ablation([[0.6, 0.1, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1]]))
    assert report.concentrated == report.deposits == ((0, 0),)
    assert [s.is_concentrated for s in report.layers] == [True, False]


def test_circuit_names_its_top_head_by_the_two_definitions(tmp_path):
    """`pe-interp circuit` says "single-head deposit" only for dominance() and "layer
    concentration" for find_deposits' looser flag; neither when nothing is flagged."""
    from types import SimpleNamespace

    from pe_interp.commands.circuit import top_head

    run = SimpleNamespace(run_dir=tmp_path, result_dir=tmp_path, at_step=None, name=str(tmp_path))
    cases = [
        (
            grid((1, 2, 0.652), (0, 1, 0.03), rest=0.01),
            (1, 2),
            "single-head deposit (ablation.json)",
        ),
        (
            grid((0, 0, 0.652), (1, 1, 0.258), rest=0.01),
            (0, 0),
            "layer concentration, no single-head deposit (ablation.json)",
        ),
        (
            grid((1, 3, 0.02), rest=0.015),
            (1, 3),
            "largest ablation drop; no single-head deposit or layer concentration (ablation.json)",
        ),
    ]
    for drops, head, why in cases:
        a = ablation(drops)
        assert dominance(a).single == why.startswith("single") and bool(
            find_deposits(a).deposits
        ) != why.startswith("largest")
        a.save(tmp_path / "ablation.json")
        assert top_head(run) == (head, why)


def test_a_constructed_control_never_counts_toward_the_headline(tmp_path, monkeypatch, capsys):
    """A planted-* checkpoint built to say yes beside a trained model that says no: the first
    screen and the demo's CLI both answer No for the trained models, and set the control apart."""
    from types import SimpleNamespace

    import pe_interp.reproduce as reproduce
    from pe_interp.cli import main
    from pe_interp.report import data
    from pe_interp.report.verdict import first_screen

    def cell(name, label, drops, params):
        a = ablation(drops)
        run = tmp_path / name
        run.mkdir()
        return CellInfo(name, label, "distance", 0, "multiplicative", params, {"test_acc": 0.9},
                        run, None, a, find_deposits(a))  # fmt: skip

    control = cell(
        "planted", "rope [checkpoint planted-single-yes]", grid((0, 0, 0.9), rest=0.0),
        {"encoding": "rope", "checkpoint": "planted-single-yes"},
    )  # fmt: skip
    trained = cell("trained", "rope", grid((0, 0, 0.3), (1, 2, 0.2)), {"encoding": "rope"})
    cells = [control, trained]
    assert data.is_control(control) and not data.is_control(trained)
    answer, lines = deposit_answer(cells, "distance")
    assert answer.startswith("**No**: no single-head deposit in this model on Task 1")
    assert len(lines) == 1 and "checkpoint" not in lines[0][1]
    page = first_screen(cells)
    box = page[: page.index("Constructed controls, not counted in the answer above")]
    assert "<b>No</b>: no single-head deposit in this model" in box and "<b>Yes</b>" not in page
    assert "planted-single-yes" not in box  # the control is only below, as a control
    controls = page[page.index("Constructed controls") : page.index("</div>")]
    assert "<b>single-head deposit at L0H0</b>" in controls
    assert "ablation heatmap constructed control: rope [checkpoint planted-single-yes]" in page
    # the demo's CLI prints the same answer, the control apart
    summary = SimpleNamespace(failed={}, done=[1, 2], skipped=[])
    monkeypatch.setattr(reproduce, "demo", lambda *a, **k: (summary, tmp_path / "report.html"))
    monkeypatch.setattr(data, "load_cells", lambda out: (cells, []))
    assert main(["demo", "--out", str(tmp_path / "demo"), "--checkpoints", ""]) == 0
    printed = capsys.readouterr().out
    said = printed.split("The trained models: is there a single-head deposit, and where?\n  ")[1]
    assert said.startswith(answer.replace("**", "") + "\n")
    assert printed.index("A constructed model first") < printed.index("The trained models")

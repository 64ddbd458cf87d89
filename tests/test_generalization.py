"""The length-generalisation probe (probes.generalization), its command, its sweep probe, and the
report's concentration / link statistics (pe_interp.report.generalization).

Each number is recomputed independently: the widened model against the trained one on in-range
inputs, a condition's accuracy against a hand-built wide model on the extended task's rows, the
concentration measures against hand-made ablation grids, Spearman's rho against its closed form.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

import pe_interp
from pe_interp import HookedPETransformer
from pe_interp.cli import main
from pe_interp.report.generalization import concentration, layer0_cost, spearman, spearman_ci
from pe_interp.tasks import Batch
from pe_interp.training.trainer import evaluate
from probes import AblationResult, GeneralizationResult, length_generalization, widened

COMPUTED = [
    "nope",
    "sinusoidal",
    "rope",
    "alibi",
    {"name": "t5", "buckets": 8},
    "sinusoidal+rope",
    "decoupled_rope",
]
PER_POSITION = {"learned": "encoding.W_pos", "t5": "encoding.rel_bias"}


@pytest.mark.parametrize("encoding", COMPUTED, ids=str)
@pytest.mark.parametrize("mask_padding", [True, False])
def test_widened_model_is_the_same_function_on_trained_lengths(
    encoding, mask_padding, make_model, tokens_fn
) -> None:
    model = make_model(encoding=encoding, mask_padding=mask_padding, seed=3)
    wide, why = widened(model, 2 * model.cfg.n_ctx)
    assert why == "" and wide.cfg.n_ctx == 2 * model.cfg.n_ctx
    tokens = tokens_fn(5, model.cfg.n_ctx, lengths=[12, 9, 5, 12, 3])
    with torch.no_grad():
        assert torch.allclose(wide(tokens), model(tokens), atol=1e-5)
        longer = torch.cat([tokens, tokens], dim=1)
        assert wide(longer).shape == (
            5,
            model.cfg.n_classes,
        )  # and it takes what the old one cannot
    with pytest.raises(ValueError, match="exceeds n_ctx"):
        model(longer)
    assert widened(model, model.cfg.n_ctx) == (model, "")


@pytest.mark.parametrize("encoding", list(PER_POSITION))
def test_a_trained_table_per_position_cannot_be_widened(encoding, make_model) -> None:
    model = make_model(encoding=encoding)
    wide, why = widened(model, 2 * model.cfg.n_ctx)
    assert wide is None and PER_POSITION[encoding] in why and "n_ctx=12" in why


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, pe_interp.runs.checkpoint.Run]:
    out = {}
    for task, encoding in (("distance", "rope"), ("distance", "learned"), ("count", "alibi")):
        d = tmp_path_factory.mktemp("gen") / f"{task}-{encoding}"
        pe_interp.train(task=task, encoding=encoding, preset="smoke", seed=0, out=d, progress=False)
        out[f"{task}-{encoding}"] = pe_interp.load_run(d)
    return out


def _train_rows(run) -> Batch:
    cfg = run.train_cfg
    return run.task.splits(cfg.n_train, cfg.n_test, seed=cfg.seed)[0]


def test_conditions_score_the_extended_rows_with_the_same_weights(runs) -> None:
    run = runs["distance-rope"]
    train = _train_rows(run)
    result = length_generalization(
        run.model, run.task, n=300, extras=[3, 16], exclude=train, seed=5
    )
    assert [(c.family, c.extra) for c in result.conditions] == [
        ("trained", 0),
        *itertools.product(("shift", "sides", "right"), (3, 16)),
    ]
    for c in result.conditions:
        task = run.task if c.family == "trained" else run.task.extended(c.family, c.extra)
        rows = task.sample(300, seed=5)
        assert c.max_len == task.max_len == run.task.max_len + c.extra
        hand = HookedPETransformer(
            run.model.cfg.replace(n_ctx=task.max_len)
        )  # a wide model, built by hand
        hand.load_state_dict(run.model.state_dict())
        acc = evaluate(hand, rows)["acc"]
        assert c.n + c.dropped == 300 and c.dropped == 0  # no extended row is a training row
        assert c.correct == round(acc * 300)
        lo, hi = c.interval()
        assert lo <= c.accuracy <= hi and c.chance == pytest.approx(1 / 6)
    assert result.trained.accuracy == pytest.approx(
        evaluate(run.model, run.task.sample(300, seed=5))["acc"]
    )
    back = GeneralizationResult.load(result.save(run.run_dir / "g.json"))
    assert back.to_dict() == json.loads(json.dumps(back.to_dict())) and back.to_dict()[
        "conditions"
    ] == [json.loads(json.dumps(c.to_dict())) for c in result.conditions]
    assert not math.isnan(result.family_mean("shift")) and "shift" in result.summary()


def test_training_rows_are_left_out(runs) -> None:
    run = runs["distance-rope"]
    rows = run.task.sample(200, seed=1)
    result = length_generalization(
        run.model, run.task, n=200, extras=[2, 4], families=["right"], exclude=rows, seed=1
    )
    assert (
        result.trained.n == 0
        and result.trained.dropped == 200
        and math.isnan(result.trained.accuracy)
    )
    # 2 more fillers on the right can still be a row of the trained task (right side <= max_side = 3),
    # and the same stream then draws it again; 4 more cannot
    short = result.condition("right", 2)
    assert short.n + short.dropped == 200 and short.dropped > 0
    assert result.condition("right", 4).dropped == 0


def test_learned_table_is_reported_not_failed(runs) -> None:
    run = runs["distance-learned"]
    result = length_generalization(run.model, run.task, n=100, extras=[4])
    assert result.trained.evaluated and "encoding.W_pos" in result.unrepresentable
    longer = [c for c in result.conditions if c.family != "trained"]
    assert longer and all(not c.evaluated and "W_pos" in c.note for c in longer)
    assert math.isnan(result.family_mean("shift"))


def test_count_longer_inputs_and_the_ignored_class(runs) -> None:
    run = runs["count-alibi"]
    result = length_generalization(run.model, run.task, n=300, extras=[6], ignore_index=0, seed=2)
    assert result.families == ["length"]
    c = result.condition("length", 6)
    rows = run.task.extended("length", 6).sample(300, seed=2)
    assert c.n == int((rows.labels != 0).sum()) < 300 and c.max_len == run.task.length + 6


def test_authors_mode_pads_each_condition_to_its_own_width(tmp_path) -> None:
    d = tmp_path / "authors"
    pe_interp.train(
        task="distance",
        encoding="sinusoidal+rope",
        preset="smoke",
        authors_quirks=True,
        seed=0,
        out=d,
        progress=False,
        epochs=1,
    )
    run = pe_interp.load_run(d)
    assert not run.model.cfg.mask_padding
    result = length_generalization(
        run.model, run.task, n=200, extras=[5], families=["shift"], seed=0
    )
    assert result.meta["padded_to"] == "condition max_len"
    task = run.task.extended("shift", 5)
    hand = HookedPETransformer(run.model.cfg.replace(n_ctx=task.max_len))
    hand.load_state_dict(run.model.state_dict())
    assert result.condition("shift", 5).correct == round(
        200 * evaluate(hand, task.sample(200, seed=0))["acc"]
    )


def test_bad_arguments(runs) -> None:
    run = runs["distance-rope"]
    for kwargs, pattern in (
        ({"n": 0}, "n must be a positive integer"),
        ({"extras": [0]}, "extras must be positive"),
        ({"families": ["length"]}, "family must be one of 'shift', 'sides', 'right'"),
    ):
        with pytest.raises(ValueError, match=pattern):
            length_generalization(run.model, run.task, **kwargs)


def test_cli_writes_the_result(runs, tmp_path, capsys) -> None:
    run = runs["distance-rope"]
    out = tmp_path / "g.json"
    assert (
        main(
            [
                "generalize",
                str(run.run_dir),
                "--n",
                "60",
                "--extras",
                "4",
                "--families",
                "shift",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    result = GeneralizationResult.load(out)
    assert [(c.family, c.extra, c.n) for c in result.conditions] == [
        ("trained", 0, 60),
        ("shift", 4, 60),
    ]
    assert "shift" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- statistics
def _grid(drops: list[list[float]]) -> AblationResult:
    d = np.array(drops, dtype=float)
    nan = np.full_like(d, np.nan)
    return AblationResult(
        baseline=0.9,
        values=0.9 - d,
        drops=d,
        ci_low=nan,
        ci_high=nan,
        method="zero",
        metric="accuracy",
        higher_is_better=True,
        n_examples=100,
        n_layers=d.shape[0],
        n_heads=d.shape[1],
    )


def _sets(drops: list[float], n_heads: int) -> AblationResult:
    sets = tuple(tuple((layer, h) for h in range(n_heads)) for layer in range(len(drops)))
    d = np.array(drops)
    return AblationResult(
        baseline=0.9,
        values=0.9 - d,
        drops=d,
        ci_low=d * np.nan,
        ci_high=d * np.nan,
        method="zero",
        metric="accuracy",
        higher_is_better=True,
        n_examples=100,
        n_layers=len(drops),
        n_heads=n_heads,
        head_sets=sets,
    )


def test_concentration_measures_by_hand() -> None:
    grid = _grid([[0.1, 0.6, -0.05, 0.3], [0.02, 0.0, 0.01, 0.04]])
    c = concentration(
        grid,
        _sets([0.85, 0.1], 4),
        positional=type("P", (), {"scores": torch.arange(8.0).view(2, 4) / 10})(),
    )
    assert c.head == 1 and c.drop == pytest.approx(0.6)
    assert c.share == pytest.approx(0.6 / (0.1 + 0.6 + 0.3))  # negative drops count as 0
    assert c.layer0_cost == pytest.approx(0.85) and c.positional == pytest.approx(0.1)
    assert not c.single and c.top == (
        0,
        1,
        pytest.approx(0.6),
    )  # the runner-up (0.3) is above 5 points
    alone = concentration(_grid([[0.02, 0.7, 0.01, 0.0], [0.03, 0.0, 0.04, 0.05]]))
    assert alone.single and math.isnan(alone.layer0_cost) and math.isnan(alone.positional)
    assert math.isnan(layer0_cost(_sets([0.5], 3), 4))  # no stored set is all of layer 0


def test_spearman_against_its_closed_form_and_ties() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    d = np.argsort(np.argsort(x)) - np.argsort(np.argsort(y))
    assert spearman(x, y) == pytest.approx(1 - 6 * (d**2).sum() / (30 * (30**2 - 1)))
    tied_x, tied_y = (
        np.array([1, 2, 2, 3, 4.0]),
        np.array([1, 3, 2, 4, 5.0]),
    )  # average ranks 0, 1.5, 1.5, 3, 4
    rx = np.array([0, 1.5, 1.5, 3, 4])
    assert spearman(tied_x, tied_y) == pytest.approx(np.corrcoef(rx, [0, 2, 1, 3, 4])[0, 1])
    assert math.isnan(spearman(np.ones(5), y[:5]))
    rho, lo, hi = spearman_ci(x, 2 * x + rng.normal(scale=0.5, size=30))
    assert 0 < lo <= rho <= hi <= 1 and spearman_ci(x, y) == spearman_ci(x, y)
    _, lo, hi = spearman_ci(x, y)
    assert lo < 0 < hi  # independent draws: the interval includes 0


# ------------------------------------------------------------------------------------- the report
def _point(
    label: str,
    seed: int,
    top: float,
    share_rest: float,
    retention: float,
    acc: float = 0.9,
    source: str = "quick",
):
    """A model with layer-0 drops [top, rest, rest, 0] and a translated accuracy = retention x acc."""
    from pathlib import Path

    from pe_interp.report.data import CellInfo
    from pe_interp.report.generalization import ModelPoint, concentration
    from probes.generalization import Condition

    grid = _grid([[top, share_rest, share_rest, 0.0], [0.0, 0.01, 0.0, 0.0]])
    grid = AblationResult(**{**grid.__dict__, "baseline": acc})
    n = 1000
    conds = (
        Condition("trained", 0, 16, n, round(acc * n), 0.1, 0.2),
        Condition("shift", 4, 20, n, round(retention * acc * n), 0.1, 0.2),
        Condition("shift", 8, 24, n, round(retention * acc * n), 0.1, 0.2),
        Condition("sides", 16, 32, n, round(0.5 * retention * acc * n), 0.1, 0.2),
    )
    gen = GeneralizationResult({"name": "distance"}, label, 16, conds)
    cell = CellInfo(
        f"{label}-{seed}",
        label,
        "distance",
        seed,
        "multiplicative",
        {},
        {"test_acc": acc},
        Path("/nonexistent"),
        None,
        ablation=grid,
    )
    return ModelPoint(source, cell, concentration(grid), gen)


def test_link_table_correlates_what_it_says() -> None:
    from pe_interp.report.generalization import MEASURES, concentration_table, link_table

    tops = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    retention = [0.3, 0.5, 0.4, 0.7, 0.9, 0.8]
    points = [
        _point("rope" if i % 2 else "alibi", i, t, 0.1, r)
        for i, (t, r) in enumerate(zip(tops, retention))
    ]
    points.append(_point("nope", 9, 0.3, 0.1, 1.0, acc=0.15))  # did not learn: left out of the link
    table = link_table(points)
    rec = {(r["measure"], r["concentration"]): r for r in table.records}
    r = rec[MEASURES[0], "top L0 drop"]
    assert r["n"] == 6 and r["rho"] == pytest.approx(spearman(np.array(tops), np.array(retention)))
    assert [p[:2] for p in r["points"]] == [
        pytest.approx([t, q], abs=1e-3) for t, q in zip(tops, retention)
    ]
    share = rec[MEASURES[0], "top L0 share"]  # share = top / (top + 0.2), increasing in top as well
    assert share["rho"] == pytest.approx(r["rho"])
    half = rec[MEASURES[1], "top L0 drop"]  # the 2x-length accuracy is half the translated one
    assert half["rho"] == pytest.approx(r["rho"])
    lo, hi = r["ci"]
    row = next(row for row in table.rows if row[2] == MEASURES[0] and row[3] == "top L0 drop")
    assert (
        row[1] == "quick"
        and row[4] == "6 (2 settings)"
        and row[7]
        == (
            "none detected (the interval includes 0)"
            if lo <= 0 <= hi
            else "positive (the interval excludes 0)"
        )
    )
    assert ("top L0 positional" not in {c for _, c in rec}) and (
        "L0 cost" not in {c for _, c in rec}
    )  # not stored
    mid = [
        _point("rope", i, t, 0.1, r, source="mid")
        for i, (t, r) in enumerate([(0.1, 0.9), (0.2, 0.8), (0.3, 0.7), (0.4, 0.6)])
    ]
    groups = {
        (r["group"], r["n"], round(r["rho"], 6))
        for r in link_table(points + mid).records
        if r["measure"] == MEASURES[0] and r["concentration"] == "top L0 drop"
    }
    pooled = spearman(
        np.array(tops + [0.1, 0.2, 0.3, 0.4]), np.array(retention + [0.9, 0.8, 0.7, 0.6])
    )
    assert groups == {
        ("quick", 6, round(r["rho"], 6)),
        ("mid", 4, -1.0),
        ("all", 10, round(pooled, 6)),
    }
    both = concentration_table(points + mid)  # the same label from two sources: two rows
    assert [(row[1], row[2], row[3]) for row in both.rows if row[1] == "rope"] == [
        ("rope", "quick", "3"),
        ("rope", "mid", "4"),
    ]
    conc = concentration_table(points)
    assert [row[1] for row in conc.rows] == ["nope", "alibi", "rope"]  # the reproduction's order
    assert (
        conc.rows[2][5] == "0 of 3 [0, 56]%" and conc.rows[2][7] == "50.0 ± 20.0"
    )  # rope: tops 0.3, 0.5, 0.7


def test_report_section_from_a_sweep(tmp_path) -> None:
    from pe_interp.report import write_report
    from pe_interp.sweep import parse_grid, run_sweep

    grid = parse_grid(
        {
            "name": "g",
            "base": {"preset": "smoke", "task": "distance", "epochs": 1},
            "axes": {"encoding": ["rope", "learned"]},
            "seeds": [0],
            "probes": ["ablation", "positional", "generalization"],
            "probe_options": {
                "ablation": {"whole_layers": True, "n": 64},
                "positional": {"every_model": True, "n": 8},
                "generalization": {"n": 64, "extras": [4]},
            },
        },
        source="g.yaml",
    )
    assert not run_sweep(grid, tmp_path, progress=False, workers=1).failed
    html = write_report(tmp_path, preset="smoke").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    tables = summary["tables"]
    gen = tables["generalization-distance"]
    assert [r[0] for r in gen["rows"]] == ["learned", "rope"]
    assert gen["columns"][3:8] == ["in range (≤ 16)", "shift +4", "sides +4", "right +4", "note"]
    assert gen["rows"][0][4] == "—" and "a trained parameter per position" in gen["rows"][0][-1]
    stored = GeneralizationResult.load(next(tmp_path.glob("cells/*rope*/run/generalization.json")))
    assert gen["rows"][1][4] == f"{100 * stored.condition('shift', 4).accuracy:.1f} ± 0.0"
    conc = tables["concentration"]["records"]
    assert {r["label"] for r in conc} == {"learned", "rope"} and all(
        not math.isnan(r["l0_cost"][0]) for r in conc
    )
    assert (
        "Length generalisation and concentration" in html
        and "## Does concentration predict" in (tmp_path / "summary.md").read_text()
    )


def test_wilson_interval_closed_forms() -> None:
    from statistics import NormalDist

    from probes.common.metrics import wilson as wilson_interval

    z = NormalDist().inv_cdf(0.975)
    assert wilson_interval(0, 3) == (
        0.0,
        pytest.approx(z * z / (3 + z * z)),
    )  # k = 0: [0, z^2/(n+z^2)]
    assert wilson_interval(3, 3) == (pytest.approx(3 / (3 + z * z)), 1.0)
    lo, hi = wilson_interval(50, 100)  # symmetric about 1/2
    assert lo == pytest.approx(1 - hi) and lo == pytest.approx(0.4038, abs=1e-4)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))

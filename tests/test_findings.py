"""Findings (pe_interp.sweep.findings): one summary per finished cell, written by the sweep, that
makes a cell finished on a machine without its run directory; and the study built from them
(pe-interp study: rates with Wilson intervals, verdict, dynamics figure, the README block)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pe_interp.cli import main
from pe_interp.report.findings import condition_rows, model_rows, update_readme, verdict
from pe_interp.sweep import load_grid, run_sweep
from pe_interp.sweep.findings import (
    FINDING_KEYS,
    ablation_of,
    has_finding,
    layer_ablation_of,
    load_findings,
)

GRID = """
name: smk
findings: found
base: {{preset: smoke, task: distance, encoding: rope, amp: false, epochs: 2}}
seeds: [0, 1]
variants:
  - {{}}
  - {{lr: 0.01, seeds: [0]}}
probes: [ablation, dynamics, routes]
probe_options:
  ablation: {{n: {n}, whole_layers: true}}
  routes: {{n: 32}}
  dynamics: {{every: 4, n_probe: 32}}
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("findings")
    (root / "grid.yaml").write_text(GRID.format(n=64))
    grid = load_grid(root / "grid.yaml")
    summary = run_sweep(grid, root / "sweep", workers=1, progress=False)
    return root, grid, summary


def test_each_finished_cell_has_a_finding_with_the_studys_keys(swept):
    root, grid, summary = swept
    assert len(summary.done) == 3 and not summary.failed
    found = load_findings(root / "found")  # relative to the grid file
    assert len(found) == 3
    for f in found:
        assert set(FINDING_KEYS) <= set(f)
        assert np.asarray(f["drops"]).shape == (2, 4) and len(f["layer_drops"]) == 2
        result = json.loads((root / "sweep" / "cells" / f["id"] / "result.json").read_text())
        a = ablation_of(f)
        # the finding is the stored ablation, number for number
        np.testing.assert_array_equal(
            a.drops, np.asarray(result["ablation"]["ablation"]["drops"], dtype=float)
        )
        assert layer_ablation_of(f).head_sets[0] == tuple((0, h) for h in range(4))
        assert f["test_acc"] == result["final"]["test_acc"]
        assert [r["step"] for r in f["dynamics"]] == [0, 4, 8, 12, 16]
        assert len(f["weights"]["sha256"]) == 64 and f["weights"]["step"] == 16
        # the positional criterion with the checks behind it (5 significant digits)
        routes = result["routes"]
        for key in ("effect", "counterfactual_effect", "identity_gap"):
            assert f["routes"][key] == pytest.approx(routes[key], rel=1e-4, abs=1e-12)
        np.testing.assert_allclose(f["routes"]["shares"], routes["shares"], rtol=1e-4, atol=1e-12)
        assert f["routes"]["effect_ci"] == pytest.approx(routes["effect_ci"], rel=1e-4, abs=1e-12)
    assert {f["condition"] for f in found} == {"base", "lr=0.01"}


def test_a_finding_finishes_a_cell_on_a_machine_without_its_run(swept, tmp_path):
    root, grid, _ = swept
    again = run_sweep(grid, tmp_path / "elsewhere", workers=1, progress=False)
    assert again.done == [] and len(again.skipped) == 3
    assert not (tmp_path / "elsewhere" / "cells").exists()  # nothing trained


def test_other_probe_options_do_not_count(swept, tmp_path):
    root, _, _ = swept
    (root / "other.yaml").write_text(GRID.format(n=32))
    other = load_grid(root / "other.yaml")
    assert not any(has_finding(other, c) for c in other.cells())


def test_study_from_findings(swept, tmp_path, capsys):
    root, grid, _ = swept
    readme = tmp_path / "findings" / "README.md"  # where the committed studies' blocks live
    readme.parent.mkdir()
    readme.write_text("intro\n<!-- study:found begin -->\nold\n<!-- study:found end -->\nrest\n")
    assert (
        main(
            [
                "study",
                str(root / "found"),
                "--grid",
                str(root / "grid.yaml"),
                "--out",
                str(tmp_path / "s"),
                "--readme",
                str(readme),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Single-head deposit in 0 of 3 models" in out  # smoke models learn nothing in 2 epochs
    text = readme.read_text()
    assert text.startswith("intro\n<!-- study:found begin -->\n| condition |") and text.endswith(
        "<!-- study:found end -->\nrest\n"
    )
    assert "| base | 2 |" in text and "| lr=0.01 | 1 |" in text and "old" not in text
    assert (tmp_path / "s" / "dynamics.png").read_bytes()[:4] == b"\x89PNG"
    study = json.loads((tmp_path / "s" / "study.json").read_text())
    assert [c["condition"] for c in study["conditions"]] == ["base", "lr=0.01"]
    assert main(["study", str(tmp_path / "nothing")]) == 2
    # the default output folder sits inside the findings directory and is not read as findings
    copy = tmp_path / "found"
    copy.mkdir()
    for f in (root / "found").glob("*.json"):
        (copy / f.name).write_text(f.read_text())
    assert main(["study", str(copy)]) == 0 and main(["study", str(copy)]) == 0
    assert (copy / "study" / "STUDY.md").is_file()


def _finding(condition: str, seed: int, drops: np.ndarray, layer0: float = 0.9) -> dict:
    n_layers, n_heads = drops.shape
    return {
        "format": 1,
        "id": f"{condition}-{seed}",
        "condition": condition,
        "seed": seed,
        "test_acc": 0.92,
        "final": {"step": 960},
        "baseline": 0.92,
        "values": (0.92 - drops).tolist(),
        "drops": drops.tolist(),
        "ci_low": (drops - 0.02).tolist(),
        "ci_high": (drops + 0.02).tolist(),
        "method": "zero",
        "metric": "accuracy",
        "higher_is_better": True,
        "n_examples": 1000,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_bootstrap": 1000,
        "ci": 0.95,
        "bootstrap_seed": 0,
        "layer_drops": [layer0] + [0.1] * (n_layers - 1),
        "layer_ci_low": [layer0 - 0.02] * n_layers,
        "layer_ci_high": [layer0 + 0.02] * n_layers,
        "layer_values": [0.1] * n_layers,
        "dynamics": [
            {"step": 0, "layer": 0, "baseline": 0.1, "drops": [0.0] * n_heads},
            {"step": 96, "layer": 0, "baseline": 0.5, "drops": [0.3] + [0.0] * (n_heads - 1)},
        ],
        "seconds": {"train": 1500.0},
        "machine": {"cpu_bf16": True},
    }


def test_rates_and_criteria_on_known_grids():
    single = np.full((6, 16), 0.01)
    single[0, 5] = 0.62
    concentrated = np.full((6, 16), 0.01)
    concentrated[0, 2], concentrated[3, 1] = (
        0.25,
        0.08,
    )  # 25 points, ~74% of layer 0; a second head matters
    spread = np.full((6, 16), 0.02)
    found = [
        _finding("base", 0, single),
        _finding("base", 1, concentrated),
        _finding("base", 2, spread),
        _finding("x=1", 0, spread),
    ]
    models = model_rows(found)
    assert [(m.single, m.l0_concentration) for m in models] == [
        (True, True),
        (False, True),
        (False, False),
        (False, False),
    ]
    assert (
        models[0].top == "L0H5"
        and models[0].peak_l0_drop == pytest.approx(0.3)
        and models[0].peak_step == 96
    )
    assert models[0].layer0_drop == pytest.approx(0.9)
    base, x = condition_rows(models)
    assert (base.n, base.k_single, base.k_concentration) == (3, 1, 2)
    assert base.single_ci == pytest.approx((0.0615, 0.7923), abs=1e-4)  # Wilson, 1 of 3
    assert base.median_top_drop == pytest.approx(0.25) and (x.n, x.k_single) == (1, 0)
    # the criterion's halves, alone: only `single` has a 50-point head; `single` and `spread` keep
    # every other head within 5 points, `concentrated` does not (its L3H1 costs 8)
    assert [(m.top_large, m.others_small) for m in models] == [
        (True, True),
        (False, False),
        (False, True),
        (False, True),
    ]
    text = verdict([base, x], models)
    assert text.startswith(
        "Single-head deposit in 1 of 4 models (Wilson 95% interval 5–70%), in: base."
    )
    assert (
        "a head costing ≥ 50 points in 1 of 4 (the largest single-head drop: L0H5 62.0 points, base seed 0); "
        "every other head within 5 points in 3 of 4."
    ) in text
    # ...and decided on the intervals the findings keep (yes, no or undecided, issue 39)
    assert [m.decided for m in models][0] in (
        "yes",
        "undecided",
    ) and "Decided on the bootstrap intervals" in text


def test_the_positional_column_appears_where_a_model_was_measured():
    from pe_interp.report.findings import markdown

    drops = np.full((6, 16), 0.02)
    plain = [_finding("base", 0, drops), _finding("base", 1, drops)]
    assert "positional deposit" not in markdown(
        condition_rows(model_rows(plain)), model_rows(plain)
    )
    # the encoding carries 10 of 20 logits in one model (the causal mask the rest), 9 of 10 in the other
    measured = [
        dict(
            plain[0],
            routes={"verdict": "yes", "top": "L0H3", "effect": 10.0, "counterfactual_effect": 20.0},
        ),
        dict(plain[1], routes={"verdict": "no", "effect": 9.0, "counterfactual_effect": 10.0}),
        _finding("x=1", 0, drops),
    ]
    models = model_rows(measured)
    conds = condition_rows(models)
    text = markdown(conds, models)
    head, rule, base, x = text.splitlines()[:4]
    assert (
        "| positional deposit, k of n measured [95% CI] |" in head
        and rule.count("---") == head.count("|") - 1
    )
    assert (
        "| 1 of 2 [9, 91]% | 70 |" in base and base.count("|") == head.count("|") and "| — |" in x
    )
    assert "| median positional effect through the encoding, % of all |" in head and x.count(
        "|"
    ) == head.count("|")
    # no positional effect to divide (under route shares' NO_EFFECT, or not kept): no share
    tiny = model_rows(
        [
            dict(
                plain[0], routes={"verdict": "no", "effect": 0.004, "counterfactual_effect": 0.002}
            ),
            dict(plain[1], routes={"verdict": "no", "effect": None, "counterfactual_effect": 20.0}),
        ]
    )
    assert [m.encoding_part for m in tiny] == [None, None] and condition_rows(tiny)[
        0
    ].median_encoding_part is None
    assert (
        "Positional deposit (one route carries ≥ 50% of the positional effect, every other ≤ 5%) in 1 of the 2 "
        "models it was measured on (Wilson 95% 9–91%)."
    ) in verdict(conds, models)


def test_the_committed_blocks_live_in_findings_readme():
    """Every --readme of the Makefile writes findings/README.md, which holds each block's markers;
    the top-level README holds no generated block."""
    from pe_interp.report.findings import BEGIN, END

    root = Path(__file__).resolve().parents[1]
    blocks = (root / "findings" / "README.md").read_text()
    names = []
    for line in (root / "Makefile").read_text().splitlines():
        if "--readme" not in line:
            continue
        assert "--readme findings/README.md" in line, line
        words = line.split()
        if "study" in words:
            name = Path(words[words.index("study") + 1]).name
            names.append(f"{name}-paired" if "--paired" in words else name)
        elif "validate" in words:
            names.append("planted-quick")
        else:
            names.append(Path(words[words.index("--report") + 1]).name)
    assert sorted(names) == [
        "arch-mid",
        "deposit-dynamics",
        "deposit-dynamics-fade",
        "deposit-dynamics-fade-paired",
        "deposit-mid",
        "planted-quick",
        "smollm2",
    ]
    for name in names:
        assert BEGIN.format(name=name) in blocks and END.format(name=name) in blocks, name
    assert "<!-- study:" not in (root / "README.md").read_text()


def test_readme_needs_its_markers(tmp_path):
    readme = tmp_path / "R.md"
    readme.write_text("no markers\n")
    assert not update_readme(readme, "found", "table")
    assert readme.read_text() == "no markers\n"


def test_findings_dir_errors(tmp_path):
    with pytest.raises(ValueError, match="no findings directory"):
        load_findings(tmp_path / "none")
    (tmp_path / "bad.json").write_text(json.dumps({"id": "x"}))
    with pytest.raises(ValueError, match="not findings of format 1"):
        load_findings(tmp_path)
    Path(tmp_path / "bad.json").unlink()

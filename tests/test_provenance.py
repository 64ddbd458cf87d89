"""No stale answers (issue 21, item 3) and a sweep directory's probes kept in step with its grid
(item 2): every probe result records the weights it came from; ``show``, ``report``,
``circuit``, ``sweep-report`` and the demo's cells refuse or visibly mark results of other
weights; a rerun of the same grid with other probe options or more probes recomputes exactly
the probes concerned, and says which.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import pe_interp
from pe_interp.cli import main
from pe_interp.runs.checkpoint import (
    CURRENT,
    STALE,
    UNRECORDED,
    WEIGHTS_KEY,
    weights_provenance,
    weights_status,
)
from pe_interp.sweep import collect
from pe_interp.training.callbacks import Callback
from pe_interp.util.interrupts import Interrupted

SMOKE = dict(preset="smoke", progress=False)
PROBES = "probes: [ablation, patching, positional, attention, decomposition, generalization]\n"
GRID = (
    "name: p\nbase: {preset: smoke, task: distance, epochs: 1, n_train: 128, n_test: 64}\naxes: {encoding: [rope]}\n"
    + PROBES
)
OPTIONS = (
    "probe_options: {ablation: {n: 32, whole_layers: true}, patching: {n: 8}, positional: {n: 4}, "
    "generalization: {n: 8, extras: [2]}}\n"
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nudge(run_dir: Path) -> None:
    """Other weights under the same name and step (a retrained or replaced model)."""
    path = run_dir / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    key = sorted(tensors)[0]
    tensors[key] = tensors[key] + 1e-3
    save_file(tensors, str(path), metadata=meta)


class StopAt(Callback):
    """Sends this process SIGINT after ``step``: the trainer stops at a step boundary, saved."""

    def __init__(self, step: int):
        self.at = step

    def on_step(self, trainer, step, loss):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prov")
    (root / "g.yaml").write_text(GRID + OPTIONS)
    assert main(["sweep", str(root / "g.yaml"), "--out", str(root / "s"), "--no-progress"]) == 0
    return root / "s"


def test_every_probe_result_records_the_weights_it_came_from(sweep_dir, tmp_path):
    cell = next((sweep_dir / "cells").iterdir())
    run = cell / "run"
    now = weights_provenance(run)
    assert now == {"sha256": sha(run / "model.safetensors"), "step": 2}
    files = sorted(p.name for p in run.glob("*.json") if p.name != "config.json")
    assert files == [
        "ablation.json",
        "attention.json",
        "decomposition.json",
        "deposits.json",
        "generalization.json",
        "layer_ablation.json",
        "patching.json",
        "positional.json",
    ]
    for name in files:
        assert json.loads((run / name).read_text())[WEIGHTS_KEY] == now, name
    assert json.loads((cell / "result.json").read_text())[WEIGHTS_KEY] == now
    # and what the commands write into a run directory
    d = tmp_path / "run"
    shutil.copytree(run, d)
    for argv in (
        ["ablate", str(d), "--n", "16", "--n-bootstrap", "0", "--no-figures", "--no-progress"],
        ["patch", str(d), "--n", "4", "--n-bootstrap", "0", "--no-figures"],
        ["decompose", str(d), "--n", "4", "--head", "0", "--no-figures"],
        ["circuit", str(d), "--n", "4", "--top-n", "2", "--method", "atp"],
        ["generalize", str(d), "--n", "8", "--extras", "2", "--no-progress"],
    ):
        assert main(argv) == 0, argv
    for name in (
        "ablation.json",
        "deposits.json",
        "patching.json",
        "patching_z.json",
        "decompose_L0H0.json",
        "circuit.json",
        "generalization.json",
    ):
        assert json.loads((d / name).read_text())[WEIGHTS_KEY] == now, name


def test_results_of_a_run_stopped_at_step_48_are_stale_once_it_resumes(tmp_path, capsys):
    """The issue's case: ablate a run stopped at step 48, resume it to the end; show, report and
    circuit must not give the step-48 verdict as the final model's."""
    d = tmp_path / "run"
    with pytest.raises(
        Interrupted, match=r"stopped by SIGINT at step 48 of 96; the run is saved in .* at step 48"
    ):
        pe_interp.train(out=d, epochs=12, callbacks=[StopAt(48)], **SMOKE)
    assert weights_provenance(d)["step"] == 48
    assert (
        main(["ablate", str(d), "--n", "32", "--n-bootstrap", "0", "--no-figures", "--no-progress"])
        == 0
    )
    assert weights_status(d, d / "deposits.json") == (CURRENT, "")
    capsys.readouterr()
    assert main(["show", str(d)]) == 0
    assert "STALE" not in capsys.readouterr().out
    pe_interp.train(out=d, epochs=12, resume=True, **SMOKE)
    status, why = weights_status(d, d / "deposits.json")
    assert status == STALE and "step 48" in why and "step 96" in why
    assert main(["show", str(d)]) == 0
    out = capsys.readouterr().out
    assert (
        "single-head deposit  STALE: ablation.json was computed from other weights (step 48" in out
    )
    assert (
        "layer concentration  STALE: deposits.json was computed from other weights (step 48" in out
    )
    assert (
        "single-head deposit  YES" not in out
        and "single-head deposit  no" not in out
        and "  layer 0 " not in out
    )
    assert "ablation.json" in out and "STALE: of other weights" in out
    assert main(["report", str(d)]) == 0
    page = (d / "report.html").read_text()
    assert (
        "Stale results left out." in page
        and "ablation.json" in page
        and "Not measured yet." in page
    )
    assert main(["circuit", str(d), "--n", "4", "--top-n", "2", "--method", "atp"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "ablation.json: computed from other weights (step 48" in err
    ), err
    assert not (d / "circuit.json").exists()
    assert (
        main(["ablate", str(d), "--n", "32", "--n-bootstrap", "0", "--no-figures", "--no-progress"])
        == 0
    )
    assert weights_status(d, d / "deposits.json") == (CURRENT, "")


def test_the_generalisation_tables_leave_out_a_stale_result(sweep_dir, tmp_path):
    from pe_interp.report.data import load_run_cell
    from pe_interp.report.generalization import load_points

    d = tmp_path / "run"
    shutil.copytree(next((sweep_dir / "cells").iterdir()) / "run", d)
    (point,) = load_points([load_run_cell(d)], "quick")
    assert point.gen is not None and point.gen.trained.n == 8 and point.conc is not None
    nudge(d)
    cell = load_run_cell(d)
    (point,) = load_points([cell], "quick")
    assert point.gen is None and point.conc is None
    assert {"ablation.json", "layer_ablation.json", "generalization.json"} <= set(
        cell.extra["stale"]
    )
    assert "computed from other weights (step 2" in cell.extra["stale"]["generalization.json"]


def test_a_result_without_a_record_is_marked_unrecorded(sweep_dir, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(next((sweep_dir / "cells").iterdir()) / "run", d)
    record = json.loads((d / "deposits.json").read_text())
    record.pop(WEIGHTS_KEY)
    (d / "deposits.json").write_text(json.dumps(record))
    assert weights_status(d, d / "deposits.json")[0] == UNRECORDED
    assert main(["show", str(d)]) == 0
    out = capsys.readouterr().out
    assert "(deposits.json records no weights" in out and "(weights not recorded)" in out


def _rerun(sweep_dir: Path, text: str, capfd) -> tuple[int, str, dict]:
    grid = sweep_dir.parent / "g2.yaml"
    grid.write_text(text)
    capfd.readouterr()
    code = main(["sweep", str(grid), "--out", str(sweep_dir), "--no-progress"])
    out, err = capfd.readouterr()
    return code, err, json.loads(out.strip().splitlines()[-1])


def test_changed_probe_options_recompute_exactly_the_probes_concerned(sweep_dir, tmp_path, capfd):
    d = tmp_path / "s"
    shutil.copytree(sweep_dir, d)
    cell = next((d / "cells").iterdir())
    before = {p.name: sha(p) for p in (cell / "run").glob("*.json")}
    code, err, summary = _rerun(d, GRID + OPTIONS, capfd)  # the same grid: nothing to do
    assert (
        code == 0
        and summary["skipped"] == 1
        and not summary["recomputed"]
        and "recomputing" not in err
    )
    code, err, summary = _rerun(d, GRID + OPTIONS.replace("n: 32", "n: 24"), capfd)
    assert code == 0 and summary["recomputed"] == {
        cell.name: ["ablation", "attention", "decomposition"]
    }
    assert (
        "p: recomputing ablation, attention, decomposition in 1 finished cell(s) (probe_options.ablation "
        '{"n": 32, "whole_layers": true} -> {"n": 24, "whole_layers": true})'
    ) in err, err
    after = {p.name: sha(p) for p in (cell / "run").glob("*.json")}
    assert {k for k in after if after[k] != before[k]} == {
        "ablation.json",
        "deposits.json",
        "layer_ablation.json",
        "attention.json",
        "decomposition.json",
    }
    result = json.loads((cell / "result.json").read_text())
    assert result["ablation"]["ablation"]["n_examples"] == 24
    assert result["probe_options_run"]["ablation"] == {"n": 24, "whole_layers": True}
    assert json.loads((d / "grid.json").read_text())["probe_options"]["ablation"]["n"] == 24
    assert sha(cell / "run" / "model.safetensors") == sha(
        sweep_dir / "cells" / cell.name / "run" / "model.safetensors"
    )


def test_an_added_probe_runs_alone(tmp_path, capfd):
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.replace(PROBES, "probes: [positional]\n"))
    assert main(["sweep", str(grid), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    cell = next((tmp_path / "s" / "cells").iterdir())
    positional = sha(cell / "run" / "positional.json")
    code, err, summary = _rerun(
        tmp_path / "s", GRID.replace(PROBES, "probes: [positional, patching]\n"), capfd
    )
    assert code == 0 and summary["recomputed"] == {cell.name: ["patching"]}
    assert "recomputing patching in 1 finished cell(s) (patching added to probes)" in err
    assert sha(cell / "run" / "positional.json") == positional


def test_a_cell_of_other_weights_is_left_out_then_recomputed(sweep_dir, tmp_path, capfd):
    d = tmp_path / "s"
    shutil.copytree(sweep_dir, d)
    cell = next((d / "cells").iterdir())
    nudge(cell / "run")
    results, errors = collect(d)
    assert not results and len(errors) == 1 and errors[0]["stale"]
    assert "stale results: computed from other weights (step 2" in errors[0]["error"]
    assert main(["sweep-report", str(d)]) == 0
    assert "stale results" in (d / "report.md").read_text()
    assert main(["report", str(d)]) == 0
    assert "stale results" in (d / "summary.md").read_text()
    code, err, summary = _rerun(d, GRID + OPTIONS, capfd)
    assert code == 0 and summary["recomputed"] == {
        cell.name: [
            "ablation",
            "patching",
            "positional",
            "attention",
            "decomposition",
            "generalization",
        ]
    }
    assert "(their results came from other weights)" in err
    results, errors = collect(d)
    assert len(results) == 1 and not errors
    assert results[0][WEIGHTS_KEY] == weights_provenance(cell / "run")

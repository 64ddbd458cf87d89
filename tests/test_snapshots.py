"""Training snapshots (issue 37): the schedule, the manifest, exact weights at every step, resume,
``load_run(step=)`` / ``RUN@S``, and ``pe-interp dynamics`` against a naive hook loop."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

import pe_interp
from pe_interp.config.presets import build_run_configs
from pe_interp.runs.checkpoint import CheckpointError, load_run, split_step
from pe_interp.runs.snapshots import (
    MANIFEST,
    SNAPSHOT_DIR,
    read_manifest,
    snapshot_path,
    snapshot_schedule,
)
from pe_interp.training.callbacks import Callback
from pe_interp.training.trainer import Trainer


def test_schedule_is_powers_of_two_then_every_interval_and_the_end():
    assert snapshot_schedule(100, 48) == [0, 1, 2, 4, 8, 16, 32, 48, 96, 100]
    assert snapshot_schedule(96, 48) == [0, 1, 2, 4, 8, 16, 32, 48, 96]
    assert snapshot_schedule(5, 48) == [0, 1, 2, 4, 5]
    assert snapshot_schedule(96, 48, "none") == []
    with pytest.raises(ValueError, match="snapshots must be one of"):
        snapshot_schedule(96, 48, "linear")


def test_train_config_refuses_bad_snapshot_settings():
    with pytest.raises(ValueError, match="TrainConfig.snapshots must be one of"):
        pe_interp.TrainConfig(snapshots="every")
    with pytest.raises(ValueError, match="snapshot_every must be an integer >= 0"):
        pe_interp.TrainConfig(snapshot_every=-1)


class Record(Callback):
    """The model's weights after every step (what a snapshot of that step must hold)."""

    def __init__(self):
        self.states = {}

    def on_train_start(self, trainer):
        self.states[trainer.step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    def on_step(self, trainer, step, loss):
        self.states[step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _trainer(tmp_path, name="run", callbacks=(), **train):
    model_cfg, task, train_cfg = build_run_configs(
        task="distance",
        encoding="rope",
        preset="smoke",
        seed=0,
        snapshots="log",
        snapshot_every=6,
        checkpoint_every=4,
        **train,
    )
    return Trainer(
        model_cfg, task, train_cfg, run_dir=tmp_path / name, callbacks=callbacks, progress=False
    )


def test_snapshots_hold_the_weights_of_their_step_with_hashes_in_the_manifest(tmp_path):
    rec = Record()
    trainer = _trainer(tmp_path, callbacks=[rec])
    trainer.fit()
    run_dir = tmp_path / "run"
    total = trainer.train_cfg.total_steps
    assert pe_interp.snapshot_steps(run_dir) == snapshot_schedule(total, 6)
    for entry in read_manifest(run_dir):
        data = snapshot_path(run_dir, entry["step"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
        loaded = load_run(run_dir, step=entry["step"])
        assert loaded.provenance == {"sha256": entry["sha256"], "step": entry["step"]}
        for k, v in loaded.model.state_dict().items():
            assert torch.equal(v, rec.states[entry["step"]][k]), (entry["step"], k)
    # the last snapshot is the run's final weights, byte for byte
    final = read_manifest(run_dir)[-1]
    assert final["step"] == total
    assert (
        final["sha256"] == hashlib.sha256((run_dir / "model.safetensors").read_bytes()).hexdigest()
    )


class CrashAt(Callback):
    def __init__(self, step):
        self.at = step

    def on_step(self, trainer, step, loss):
        if step == self.at:
            raise RuntimeError("crash")


def test_a_crash_and_resume_ends_with_the_same_snapshots(tmp_path):
    _trainer(tmp_path, "ref").fit()
    with pytest.raises(RuntimeError, match="crash"):
        _trainer(tmp_path, "crashed", callbacks=[CrashAt(7)]).fit()
    # step 6's snapshot was written before the crash, after the last checkpoint (step 4)
    assert 6 in pe_interp.snapshot_steps(tmp_path / "crashed")
    _trainer(tmp_path, "crashed").fit(resume=True)
    assert read_manifest(tmp_path / "crashed") == read_manifest(tmp_path / "ref")


def test_snapshots_need_a_run_directory():
    model_cfg, task, train_cfg = build_run_configs(
        task="distance", encoding="rope", preset="smoke", seed=0, snapshots="log"
    )
    with pytest.raises(ValueError, match="needs a run directory"):
        Trainer(model_cfg, task, train_cfg, run_dir=None, progress=False)


@pytest.fixture(scope="module")
def snap_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("snap") / "run"
    pe_interp.train(
        task="distance",
        encoding="rope",
        preset="smoke",
        seed=0,
        out=out,
        snapshots="log",
        snapshot_every=8,
        progress=False,
    )
    return out


def test_run_at_step_loads_that_snapshot_and_says_which_steps_exist(snap_run, tmp_path):
    steps = pe_interp.snapshot_steps(snap_run)
    run = load_run(f"{snap_run}@{steps[3]}")
    assert run.at_step == steps[3] and run.provenance["step"] == steps[3]
    assert (
        run.result_dir == snap_run / "steps" / str(steps[3])
        and run.name == f"{snap_run}@{steps[3]}"
    )
    assert load_run(snap_run).result_dir == snap_run
    assert split_step(f"{snap_run}") == (snap_run, None)
    with pytest.raises(
        CheckpointError, match=r"no snapshot at step 3; the run kept steps 0, 1, 2, 4"
    ):
        load_run(snap_run, step=3)
    with pytest.raises(CheckpointError, match="a step after '@' must be a whole number"):
        load_run(f"{snap_run}@last")
    with pytest.raises(CheckpointError, match="asked for step 2 too"):
        load_run(f"{snap_run}@1", step=2)
    # a damaged snapshot is refused against its manifest
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(snap_run, broken)
    path = snapshot_path(broken, steps[2])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="differs from the manifest"):
        load_run(broken, step=steps[2])
    # a run without snapshots says how to get them
    (broken / SNAPSHOT_DIR / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="train it with --snapshots log"):
        load_run(broken, step=0)


def test_dynamics_matches_a_naive_hook_loop_at_every_step(snap_run, tmp_path):
    from probes.ablation import ablate_heads_naive
    from probes.deposit.trajectory import snapshot_dynamics

    result = snapshot_dynamics(
        snap_run, n=48, n_confirm=48, n_pairs=16, n_bootstrap=50, progress=False
    )
    assert result.steps == pe_interp.snapshot_steps(snap_run)
    for record in result.records:
        run = load_run(snap_run, step=record["step"])
        test = run.examples("test", 48)
        naive = ablate_heads_naive(
            run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=0
        )
        np.testing.assert_allclose(np.asarray(record["drops"]), naive.drops, atol=1e-6)
        assert record["n_examples"] == 48 and set(record["verdicts"]) == {
            "single_head",
            "layer0",
            "positional",
        }


def test_the_dynamics_command_resumes_and_writes_its_file(snap_run, tmp_path, capsys):
    import shutil

    from pe_interp.cli import main

    run = tmp_path / "run"
    shutil.copytree(snap_run, run)
    args = [
        "dynamics",
        str(run),
        "--n",
        "32",
        "--n-confirm",
        "32",
        "--n-pairs",
        "16",
        "--no-progress",
    ]
    assert main(args + ["--steps", "0", "1"]) == 0
    first = json.loads((run / "dynamics.json").read_text())
    assert [r["step"] for r in first["records"]] == [0, 1]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "single-head deposit: yes at" in out and (run / "figures" / "dynamics.png").is_file()
    again = json.loads((run / "dynamics.json").read_text())
    assert [r["step"] for r in again["records"]] == pe_interp.snapshot_steps(run)
    assert again["records"][:2] == first["records"]  # kept, not recomputed
    assert main(["dynamics", f"{run}@4"]) == 2
    assert "give RUN_DIR without @STEP" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, written",
    [
        (["ablate", "--n", "32", "--no-progress", "--no-figures"], "ablation.json"),
        (["patch", "--n", "8", "--no-figures"], "patching.json"),
        (["decompose", "--layer", "0", "--no-figures"], "decompose_L0H"),
        (["circuit", "--n", "8"], "circuit.json"),
        (["generalize", "--n", "8", "--no-progress"], "generalization.json"),
        (["report"], "report.html"),
    ],
)
def test_every_command_reads_run_at_step_and_keeps_the_result_as_that_steps(
    snap_run, tmp_path, command, written
):
    import shutil

    from pe_interp.cli import main

    run = tmp_path / "run"
    shutil.copytree(snap_run, run)
    before = {p.name for p in run.iterdir()}
    assert main([command[0], f"{run}@4", *command[1:]]) == 0
    assert any(p.name.startswith(written) for p in (run / "steps" / "4").iterdir())
    assert {p.name for p in run.iterdir()} == before | {
        "steps"
    }  # the final model's results untouched
    assert main([command[0], f"{run}@3", *command[1:]]) == 2  # a step it did not keep: one line


def test_show_lists_the_snapshots_and_each_steps_results(snap_run, tmp_path, capsys):
    import shutil

    from pe_interp.cli import main

    run = tmp_path / "run"
    shutil.copytree(snap_run, run)
    assert main(["ablate", f"{run}@8", "--n", "32", "--no-progress", "--no-figures"]) == 0
    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "snapshots    6 kept (steps 0, 1, 2, 4, 8, 16)" in out
        and "step 8      ablation.json, deposits.json" in out
    )
    assert (
        "single-head deposit  not measured" in out
    )  # the step's result does not stand in for the final one
    assert main(["show", f"{run}@8"]) == 0
    out = capsys.readouterr().out
    assert (
        "the snapshot of step 8" in out
        and "single-head deposit  no:" in out
        and "32 examples)" in out
    )

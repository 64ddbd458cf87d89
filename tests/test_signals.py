"""Signals (issue 21, item 5): SIGINT, SIGTERM and SIGKILL during ``pe-interp train`` and
``pe-interp sweep``, each through a real process, each followed by a resume that must end bit for
bit where an uninterrupted run ends.

SIGINT and SIGTERM must stop cleanly: exit status 128 + the signal, one line that says how to go
on, a checkpoint at the step reached, the lock released, no temporary file left. SIGKILL cannot
be caught: what it leaves (the last checkpoint, a lock file whose OS lock died with the process,
perhaps a torn metrics line) must resume all the same. A sweep's parent stops its workers; a
worker whose parent is SIGKILLed stops too (SIGTERM on its parent's death).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import pe_interp
from pe_interp.sweep import load_grid
from pe_interp.util.io import LOCK_FILE, LockedError, dir_lock

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "OMP_NUM_THREADS": "1",
    "PE_INTERP_CPU_BF16": "0",
    "PYTHONUNBUFFERED": "1",
}
# 96 steps, a checkpoint every 4, dropout on: the resumed RNG stream matters
SETTINGS = dict(preset="smoke", epochs=12, checkpoint_every=4, dropout=0.1)
FLAGS = [
    "--preset",
    "smoke",
    "--epochs",
    "12",
    "--checkpoint-every",
    "4",
    "--dropout",
    "0.1",
    "--no-progress",
]
GRID = (
    "name: sig\nbase: {preset: smoke, task: distance, epochs: 12, checkpoint_every: 4, dropout: 0.1}\n"
    "axes: {encoding: [rope, alibi]}\nseeds: [0]\n"
)
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -9}


def step_of(run_dir: Path) -> int:
    try:
        with safe_open(str(run_dir / "train_state.safetensors"), framework="pt") as f:
            return int(f.metadata()["step"])
    except Exception:  # noqa: BLE001 - not written yet, or being replaced
        return -1


def records(run_dir: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k != "seconds"}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def assert_same_run(run_dir: Path, ref: Path) -> None:
    a, b = load_file(str(run_dir / "model.safetensors")), load_file(str(ref / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (
        f"{run_dir}: other weights"
    )
    assert records(run_dir) == records(ref), f"{run_dir}: other metrics"


def assert_clean(d: Path, temps: bool = True) -> None:
    """The lock is free (the process holding it is gone) and, unless SIGKILL may have cut a
    write short (``temps=False``: the next writer removes them), no temporary file is left."""
    assert not temps or not list(d.rglob("*.tmp")), list(d.rglob("*.tmp"))
    with dir_lock(d):
        pass


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("refs")
    for enc in ("rope", "alibi"):
        pe_interp.train(encoding=enc, seed=0, out=root / enc, progress=False, **SETTINGS)
    return {"rope": root / "rope", "alibi": root / "alibi"}


def start(argv: list[str], group: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pe_interp.cli", *argv],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=group,
    )


def wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, f"ended before {what}: " + proc.stderr.read().decode()[-800:]
    assert cond(), f"timed out waiting for {what}"


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_train_stopped_by_a_signal_resumes_to_the_same_run(sig, refs, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), *FLAGS]
    proc = start(argv)
    wait_for(lambda: step_of(out) >= 8, proc, "the second checkpoint")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT[sig], err.decode()
    if sig != signal.SIGKILL:
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err.decode(), err.decode()
        m = re.fullmatch(
            rf"pe-interp train: stopped by {sig.name} at step (\d+) of 96; the run is saved in "
            rf"{re.escape(str(out))} at step \1: continue it with resume=True \(the same command with "
            r"--resume\)",
            lines[0],
        )
        assert m, lines[0]
        assert (
            step_of(out) == int(m.group(1)) and 8 <= int(m.group(1)) < 96
        )  # a checkpoint where it stopped
    else:
        assert (out / LOCK_FILE).is_file() and 8 <= step_of(out) < 96
    assert_clean(out, temps=sig != signal.SIGKILL)
    done = subprocess.run(
        [sys.executable, "-m", "pe_interp.cli", *argv, "--resume"], env=ENV, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()[-800:]
    assert_same_run(out, refs["rope"])
    assert_clean(out)


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_sweep_stopped_by_a_signal_resumes_to_the_same_cells(sig, refs, tmp_path):
    """SIGINT as a terminal sends it (to the whole process group), SIGTERM and SIGKILL to the
    sweep's process alone (its workers must not go on as orphans); then the same command again."""
    grid, out = tmp_path / "g.yaml", tmp_path / "sweep"
    grid.write_text(GRID)
    argv = ["sweep", str(grid), "--out", str(out), "--workers", "2", "--no-progress"]
    proc = start(argv, group=True)
    cells = [out / "cells" / c.id / "run" for c in load_grid(grid).cells()]  # rope, then alibi
    wait_for(lambda: all(step_of(c) >= 8 for c in cells), proc, "a checkpoint in each cell")
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    text = err.decode()
    assert proc.returncode == EXIT[sig], text
    if sig != signal.SIGKILL:
        assert "Traceback" not in text, text
        assert re.fullmatch(
            rf"pe-interp sweep: stopped by {sig.name}: 0 of 2 cells finished, the running ones saved "
            rf"their checkpoints in {re.escape(str(out))}; rerun the same command to resume",
            text.strip().splitlines()[-1],
        ), text
        for c in cells:
            assert_clean(c)
        assert_clean(out)
    else:  # the workers, told by their parent's death, stop within a step
        deadline = time.time() + 120
        while time.time() < deadline and _busy(cells):
            time.sleep(0.2)
    again = subprocess.run(
        [sys.executable, "-m", "pe_interp.cli", *argv], env=ENV, capture_output=True
    )
    assert again.returncode == 0, again.stderr.decode()[-800:]
    assert json.loads(again.stdout.decode().strip().splitlines()[-1])["done"] == 2
    for c, enc in zip(cells, ("rope", "alibi")):
        assert_same_run(c, refs[enc])
        assert_clean(c)


def _busy(dirs: list[Path]) -> bool:
    for d in dirs:
        try:
            with dir_lock(d):
                pass
        except LockedError:
            return True
    return False

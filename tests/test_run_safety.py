"""Nothing lost (issue 21, item 2): run and sweep directories have one writer, a run is only ever
continued, a sweep directory belongs to one grid. A table of hostile inputs through the command
line and the Python API, each refused with one line and exit status 2 (a ValueError in the API)
while the directory it aimed at stays byte for byte as it was; then the cases whose outcome is a
correct result (a stale lock, stray temporary files, a lock file among the run files).

Locks are held by a real second process (``pe_interp.util.io.dir_lock`` in a subprocess): within one
process the lock is re-entrant, as a sweep cell needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import pe_interp
from pe_interp.cli import main
from pe_interp.runs.checkpoint import load_run
from pe_interp.util.io import LOCK_FILE, LockedError, dir_lock

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PE_INTERP_CPU_BF16": "0"}
SMOKE = dict(preset="smoke", progress=False)
GRID = "name: g\nbase: {preset: smoke, task: distance, epochs: 1, n_train: 128, n_test: 64}\naxes: {encoding: [rope]}\n"
HOLDER = (
    "import sys, time\nfrom pe_interp.util.io import dir_lock\nwith dir_lock(sys.argv[1]), dir_lock(sys.argv[2]):\n"
    "    print('held', flush=True)\n    time.sleep(900)\n"
)


def snapshot(d: Path) -> dict[str, str]:
    """Every file under ``d`` (but the lock file, which a lock attempt may create) -> sha256."""
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A finished smoke run, a finished one-cell sweep, and a copy of each locked by another process."""
    root = tmp_path_factory.mktemp("safety")
    pe_interp.train(seed=0, out=root / "run", **SMOKE)
    (root / "grid.yaml").write_text(GRID)
    assert (
        main(["sweep", str(root / "grid.yaml"), "--out", str(root / "sweep"), "--no-progress"]) == 0
    )
    shutil.copytree(root / "run", root / "locked-run")
    shutil.copytree(root / "sweep", root / "locked-sweep")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root / "locked-run"), str(root / "locked-sweep")],
        env=ENV,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout.readline().strip() == b"held"
    yield root
    holder.kill()
    holder.wait()


@dataclass
class Env:
    root: Path
    tmp: Path

    def copy(self, what: str = "run", name: str = "copy") -> Path:
        dst = self.tmp / name
        shutil.copytree(self.root / what, dst)
        return dst

    def without(self, *names: str, what: str = "run") -> Path:
        d = self.copy(what)
        for n in names:
            (d / n).unlink()
        return d

    def only(self, *names: str) -> Path:
        d = self.tmp / "partial"
        d.mkdir()
        for n in names:
            shutil.copyfile(self.root / "run" / n, d / n)
        return d

    def damaged(self, name: str, data: bytes, what: str = "run") -> Path:
        d = self.copy(what)
        (d / name).write_bytes(data)
        return d

    def grid(self, text: str, name: str = "other.yaml") -> str:
        (self.tmp / name).write_text(text)
        return str(self.tmp / name)

    def sweep_with(self, change: Callable[[dict], object]) -> Path:
        d = self.copy("sweep")
        record = json.loads((d / "grid.json").read_text())
        change(record)
        (d / "grid.json").write_text(json.dumps(record))
        return d


def train(out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "smoke", "--out", str(out), "--no-progress", *extra]


def resume(e: Env, *extra: str) -> tuple[list[str], Path]:
    d = e.copy()
    return train(d, "--resume", *extra), d


def sweep(grid: str, out: Path, *extra: str) -> list[str]:
    return ["sweep", grid, "--out", str(out), "--no-progress", *extra]


OTHER = GRID.replace("[rope]", "[alibi]")
LOCKED = r"another process is writing this (run|sweep) directory \(pid \d+: .*, since [\d:T-]+\); "

# (id, build(env) -> (argv, the directory that must not change), pattern of the one stderr line)
CLI_CASES: list[tuple[str, Callable[[Env], tuple[list[str], Path]], str]] = [
    # a finished run is never overwritten
    (
        "train over a finished run",
        lambda e: (train(d := e.copy()), d),
        r"already holds a run \(config.json, model",
    ),
    (
        "train over a finished run without its train_state",
        lambda e: (train(d := e.without("train_state.safetensors")), d),
        r"already holds a run \(config.json, model",
    ),
    (
        "train --resume over a finished run without its train_state",
        lambda e: (train(d := e.without("train_state.safetensors"), "--resume"), d),
        r"train_state.safetensors is missing, so the run cannot be continued, and starting again would replace its "
        r"model.safetensors \(step 16\)",
    ),
    (
        "train --resume without train_state or metrics (a committed checkpoint)",
        lambda e: (
            train(d := e.without("train_state.safetensors", "metrics.jsonl"), "--resume"),
            d,
        ),
        r"train_state.safetensors is missing",
    ),
    (
        "train over a directory with only metrics.jsonl",
        lambda e: (train(d := e.only("metrics.jsonl")), d),
        r"already holds a run \(metrics.jsonl\)",
    ),
    (
        "train over a directory with only config.json",
        lambda e: (train(d := e.only("config.json")), d),
        r"already holds a run \(config.json\)",
    ),
    (
        "train over a directory with only model.safetensors",
        lambda e: (train(d := e.only("model.safetensors")), d),
        r"already holds a run \(model.safetensors\)",
    ),
    (
        "train over a directory with only train_state",
        lambda e: (train(d := e.only("train_state.safetensors")), d),
        r"already holds a run \(train_state.safetensors\)",
    ),
    (
        "train --resume on weights without config.json",
        lambda e: (train(d := e.only("model.safetensors"), "--resume"), d),
        r"--resume: .* holds no run to resume; drop --resume",
    ),
    # --resume with other settings names every differing field
    (
        "train --resume --epochs 3",
        lambda e: resume(e, "--epochs", "3"),
        r"\(saved -> now: train.epochs: 2 -> 3\)",
    ),
    ("train --resume --lr 0.01", lambda e: resume(e, "--lr", "0.01"), r"train.lr: 0.003 -> 0.01\)"),
    (
        "train --resume --n-layers 3",
        lambda e: resume(e, "--n-layers", "3"),
        r"model.n_layers: 2 -> 3\)",
    ),
    (
        "train --resume --d-model 48",
        lambda e: resume(e, "--d-model", "48"),
        r"model.d_model: 32 -> 48",
    ),
    (
        "train --resume --encoding alibi",
        lambda e: resume(e, "--encoding", "alibi"),
        r'model.encoding: \[\{"name": "rope"\}\] -> \[\{"name": "alibi"\}\]',
    ),
    (
        "train --resume --seed 1",
        lambda e: resume(e, "--seed", "1"),
        r"model.seed: 0 -> 1; task.seed: 0 -> 1; train.seed: 0 -> 1",
    ),
    (
        "train --resume --max-between 5",
        lambda e: resume(e, "--max-between", "5"),
        r"task.max_between: 6 -> 5",
    ),
    (
        "train --resume --task count",
        lambda e: resume(e, "--task", "count"),
        r"task.name: \"distance\" -> \"count\"",
    ),
    (
        "train --resume --dropout 0.1",
        lambda e: resume(e, "--dropout", "0.1"),
        r"model.dropout: 0.0 -> 0.1",
    ),
    (
        "train --resume --batch-size 32",
        lambda e: resume(e, "--batch-size", "32"),
        r"train.batch_size: 64 -> 32",
    ),
    (
        "train --resume --authors-quirks",
        lambda e: resume(e, "--authors-quirks"),
        r"; and \d+ more\); resume with the run's",
    ),
    (
        "train --resume on a corrupt train_state",
        lambda e: (train(d := e.damaged("train_state.safetensors", b"junk"), "--resume"), d),
        r"train_state.safetensors: corrupt or truncated",
    ),
    (
        "train --resume on a corrupt config.json",
        lambda e: (train(d := e.damaged("config.json", b"{"), "--resume"), d),
        r"config.json: invalid JSON",
    ),
    # one writer: a second one gets a line naming the first
    (
        "train into a run another process writes",
        lambda e: (train(e.root / "locked-run", "--resume"), e.root / "locked-run"),
        LOCKED + "wait for it to end, or use another --out",
    ),
    (
        "train (no --resume) into a locked run",
        lambda e: (train(e.root / "locked-run"), e.root / "locked-run"),
        LOCKED,
    ),
    *[
        (
            f"{cmd} on a run another process writes",
            lambda e, cmd=cmd, x=x: ([cmd, str(e.root / "locked-run"), *x], e.root / "locked-run"),
            LOCKED,
        )
        for cmd, x in (
            ("ablate", ["--n", "8", "--n-bootstrap", "0", "--no-figures", "--no-progress"]),
            ("patch", ["--n", "8", "--n-bootstrap", "0", "--no-figures"]),
            ("decompose", ["--n", "4", "--no-figures"]),
            ("circuit", ["--n", "4", "--top-n", "2"]),
        )
    ],
    (
        "sweep into a sweep directory another process writes",
        lambda e: (sweep(e.grid(GRID), e.root / "locked-sweep"), e.root / "locked-sweep"),
        LOCKED
        + r"wait for it to end \(two sweeps into one directory would train every cell twice\)",
    ),
    # a sweep directory belongs to one grid
    (
        "sweep another grid into a sweep directory",
        lambda e: (sweep(e.grid(OTHER), d := e.copy("sweep")), d),
        r"belongs to grid 'g' \(grid.json\), and this grid differs \(axes.encoding: \[\"rope\"\] -> \[\"alibi\"\]\): "
        r"use another --out",
    ),
    (
        "sweep a grid with other seeds",
        lambda e: (sweep(e.grid(GRID + "seeds: [0, 1]\n"), d := e.copy("sweep")), d),
        r"differs \(seeds: \[0\] -> \[0, 1\]\)",
    ),
    (
        "sweep a grid with another base",
        lambda e: (sweep(e.grid(GRID.replace("epochs: 1", "epochs: 2")), d := e.copy("sweep")), d),
        r"differs \(base.epochs: 1 -> 2\)",
    ),
    (
        "sweep a grid with another name",
        lambda e: (sweep(e.grid(GRID.replace("name: g", "name: h")), d := e.copy("sweep")), d),
        r"belongs to grid 'g' .*differs \(name: \"g\" -> \"h\"\)",
    ),
    (
        "sweep a grid with variants",
        lambda e: (sweep(e.grid(GRID + "variants: [{}, {lr: 0.01}]\n"), d := e.copy("sweep")), d),
        r"differs \(variants: \[\{\}\] -> \[\{\}, \{\"lr\": 0.01\}\]\)",
    ),
    (
        "sweep another task into a sweep directory",
        lambda e: (
            sweep(e.grid(GRID.replace("task: distance", "task: count")), d := e.copy("sweep")),
            d,
        ),
        r"differs \(base.task: \"distance\" -> \"count\"\)",
    ),
    (
        "sweep into a directory whose grid.json is not JSON",
        lambda e: (sweep(e.grid(GRID), d := e.damaged("grid.json", b"{", "sweep")), d),
        r"grid.json: invalid JSON .*owner record is unreadable: restore it or use another --out",
    ),
    (
        "sweep into a directory whose grid.json is a list",
        lambda e: (sweep(e.grid(GRID), d := e.damaged("grid.json", b"[1]", "sweep")), d),
        r"grid.json: not a grid record \(a JSON object expected\)",
    ),
    (
        "sweep: dynamics added over trained cells",
        lambda e: (sweep(e.grid(GRID + "probes: [dynamics]\n"), d := e.copy("sweep")), d),
        r"dynamics added to probes, but dynamics records while a cell trains and 1 cell\(s\) have trained; use another --out",
    ),
    (
        "sweep: dynamics options changed over trained cells",
        lambda e: (
            sweep(
                e.grid(GRID + "probes: [dynamics]\nprobe_options: {dynamics: {points: 3}}\n"),
                d := e.sweep_with(lambda r: r.update(probes=["dynamics"])),
            ),
            d,
        ),
        r"probe_options.dynamics \{\} -> \{\"points\": 3\}, but dynamics records while a cell trains",
    ),
    (
        "train into a sweep directory",
        lambda e: (train(d := e.copy("sweep")), d),
        r"copy: a sweep directory \(grid.json\), not a run directory",
    ),
    (
        "train --resume into a sweep directory",
        lambda e: (train(d := e.copy("sweep"), "--resume"), d),
        r"--resume: .* holds no run to resume",
    ),
    (
        "sweep into a run directory",
        lambda e: (sweep(e.grid(GRID), d := e.copy()), d),
        r"copy: a run directory \(config.json\), not a sweep directory; use another --out",
    ),
    (
        "reproduce into a sweep directory of another grid",
        lambda e: (
            [
                "reproduce",
                "--preset",
                "smoke",
                "--tasks",
                "distance",
                "--encodings",
                "nope",
                "--out",
                str(d := e.copy("sweep")),
                "--no-progress",
            ],
            d,
        ),
        r"belongs to grid 'g' \(grid.json\), and this grid differs \(name: \"g\" -> \"reproduce-smoke\"",
    ),
    (
        "demo into a sweep directory of another grid",
        lambda e: (
            [
                "demo",
                "--preset",
                "smoke",
                "--encodings",
                "nope",
                "--checkpoints",
                "",
                "--out",
                str(d := e.copy("sweep")),
                "--no-progress",
            ],
            d,
        ),
        r"belongs to grid 'g' .*\(name: \"g\" -> \"demo-smoke\"",
    ),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_and_loses_nothing(case, dirs, tmp_path, capsys):
    name, build, pattern = case
    argv, guarded = build(Env(dirs, tmp_path))
    before = snapshot(guarded)
    capsys.readouterr()
    t0 = time.time()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert re.search(pattern, lines[0]), lines[0]
    assert snapshot(guarded) == before, f"{name}: {guarded} changed"
    assert time.time() - t0 < 60, f"{name}: {time.time() - t0:.0f} s to refuse"


# (id, call(env) -> the directory that must not change (called before), pattern of the message)
API_CASES: list[tuple[str, Callable[[Env], Path], Callable[[Path], object], str]] = [
    (
        "train(out=a finished run)",
        lambda e: e.copy(),
        lambda d: pe_interp.train(out=d, **SMOKE),
        r"already holds a run",
    ),
    (
        "train(resume=True, epochs=3)",
        lambda e: e.copy(),
        lambda d: pe_interp.train(out=d, resume=True, epochs=3, **SMOKE),
        r"saved -> now: train.epochs: 2 -> 3",
    ),
    (
        "train(resume=True) without train_state",
        lambda e: e.without("train_state.safetensors"),
        lambda d: pe_interp.train(out=d, resume=True, **SMOKE),
        r"train_state.safetensors is missing",
    ),
    (
        "train(out=a run another process writes)",
        lambda e: e.root / "locked-run",
        lambda d: pe_interp.train(out=d, resume=True, **SMOKE),
        LOCKED,
    ),
    (
        "run_sweep(another grid)",
        lambda e: e.copy("sweep"),
        lambda d: pe_interp.sweep.run_sweep(
            pe_interp.sweep.parse_grid(
                {"name": "g", "base": {"preset": "smoke"}, "axes": {"encoding": ["nope"]}}
            ),
            d,
            progress=False,
        ),
        r"belongs to grid 'g'",
    ),
    (
        "run_sweep(a sweep directory another process writes)",
        lambda e: e.root / "locked-sweep",
        lambda d: pe_interp.sweep.run_sweep(
            pe_interp.sweep.load_grid(d.parent / "grid.yaml"), d, progress=False
        ),
        LOCKED,
    ),
    (
        "dir_lock(a locked directory)",
        lambda e: e.root / "locked-run",
        lambda d: dir_lock(d, "run directory").__enter__(),
        LOCKED,
    ),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_refuses_and_loses_nothing(case, dirs, tmp_path):
    name, prepare, call, pattern = case
    d = prepare(Env(dirs, tmp_path))
    before = snapshot(d)
    with pytest.raises(ValueError) as err:
        call(d)
    assert "\n" not in str(err.value) and re.search(pattern, str(err.value)), str(err.value)
    assert snapshot(d) == before


def test_a_lock_left_by_a_killed_process_does_not_block(dirs, tmp_path):
    """SIGKILL leaves the lock file (with the dead holder's pid) but the OS lock goes with the
    process: the next writer takes it, and its record names the new holder."""
    d = Env(dirs, tmp_path).copy()
    code = "import sys, time\nfrom pe_interp.util.io import dir_lock\nwith dir_lock(sys.argv[1]):\n print('held', flush=True)\n time.sleep(900)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(d)], env=ENV, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"held"
    with pytest.raises(LockedError):
        dir_lock(d).__enter__()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((d / LOCK_FILE).read_text())["pid"] == proc.pid  # left behind
    with dir_lock(d):
        assert json.loads((d / LOCK_FILE).read_text())["pid"] == os.getpid()
    result = pe_interp.train(out=d, resume=True, **SMOKE)  # the finished run resumes to itself
    assert result.final["step"] == 16


def test_two_trainings_into_one_directory(tmp_path, capsys):
    """The second of two concurrent ``train --out D`` is refused; the first ends whole: its
    config, weights and metrics are one run's (the seed it was given, each step once)."""
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "pe_interp.cli", *train(out, "--seed", "1", "--epochs", "12")],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 180
    while not (out / "config.json").is_file() and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert first.poll() is None, first.stderr.read().decode()[-500:]
    assert main(train(out, "--seed", "2")) == 2
    assert re.search(LOCKED, capsys.readouterr().err)
    assert first.wait(timeout=600) == 0, first.stderr.read().decode()[-500:]
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 1
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 96
    reference = pe_interp.train(seed=1, epochs=12, out=tmp_path / "ref", **SMOKE).model
    assert all(
        (a == b).all()
        for a, b in zip(load_run(out).model.state_dict().values(), reference.state_dict().values())
    )


def test_stray_temporary_files_are_removed_on_resume_and_others_kept(dirs, tmp_path):
    d = Env(dirs, tmp_path).copy()
    strays = [
        d / ".model.safetensors.a1b2c3d4.tmp",
        d / ".metrics.jsonl.zz9_y8x7.tmp",
        d / "figures" / ".x.png.abcdefgh.tmp",
    ]
    kept = [
        d / "notes.tmp",
        d / ".model.safetensors.short.tmp",
        d / "my.model.safetensors.a1b2c3d4.tmp",
    ]
    for p in strays + kept:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"partial")
    before = snapshot(d)
    pe_interp.train(out=d, resume=True, **SMOKE)
    assert not any(p.exists() for p in strays) and all(p.exists() for p in kept)
    gone = {str(p.relative_to(d)) for p in strays} | {
        "config.json"
    }  # config.json: rewritten, its command names d
    assert {k: v for k, v in snapshot(d).items() if k not in gone} == {
        k: v for k, v in before.items() if k not in gone
    }


def test_the_lock_file_is_not_a_run_file(dirs, tmp_path, capsys):
    """A directory whose only file is a lock (a run killed before it wrote anything) takes a new
    run; show and report list no lock file; load_run reads the run beside it."""
    d = tmp_path / "fresh"
    with dir_lock(d):
        pass
    assert [p.name for p in d.iterdir()] == [LOCK_FILE]
    assert main(train(d, "--epochs", "1")) == 0
    assert load_run(d).provenance["step"] == 8
    assert main(["show", str(d)]) == 0
    out = capsys.readouterr().out
    assert LOCK_FILE not in out and "config.json" in out
    assert main(["report", str(d)]) == 0
    assert LOCK_FILE not in (d / "report.html").read_text()


@pytest.mark.parametrize("cmd", ["ablate", "patch", "decompose", "circuit", "show", "eval"])
def test_a_missing_run_directory_is_not_created(cmd, tmp_path, capsys):
    """The lock of a probe command comes after the run is loaded: a mistyped directory is one
    line, not a new empty directory holding a lock file."""
    d = tmp_path / "no-such-run"
    assert main([cmd, str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("no-such-run: run directory not found") and len(err.splitlines()) == 1, err
    assert not d.exists()

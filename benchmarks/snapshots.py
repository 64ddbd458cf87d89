"""What snapshots and the dynamics probe cost (issue 37's goals), against baselines measured in the
same run.

1. Training time with ``snapshots="log"`` against the same run without, on one core, medians of
   ``--repeats`` runs each (goal: snapshots add <= 5%), and the disk they take.
2. With run directories given (``--runs``, e.g. the dynamics study's cells): the probing time of
   ``pe-interp dynamics`` (the ``seconds`` of every record of ``dynamics.json``) against the run's
   own training time (the last ``seconds`` of ``metrics.jsonl``) (goal: <= 50% on a mid run of ~25
   snapshots).

    python benchmarks/snapshots.py [--preset quick] [--epochs 2] [--repeats 3] [--runs RUN ...]
    python benchmarks/snapshots.py --repeats 0 --runs RUN ...   # only the probing of finished runs
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import pe_interp
from pe_interp.util.hardware import cpu_has_bf16


def train_seconds(out: Path, preset: str, epochs: int, snapshots: str, every: int) -> float:
    t0 = time.perf_counter()
    pe_interp.train(
        task="distance",
        encoding="rope",
        preset=preset,
        seed=0,
        out=out,
        epochs=epochs,
        amp=False,
        snapshots=snapshots,
        snapshot_every=every,
        progress=False,
    )
    return time.perf_counter() - t0


def training_cost(args: argparse.Namespace) -> None:
    """Goal 1: training with log snapshots against the same run without, and their disk."""
    times: dict[str, list[float]] = {"none": [], "log": []}
    disk = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in ("none", "log"):  # interleaved, so that load changes hit both alike
                out = Path(tmp) / f"{mode}{i}"
                times[mode].append(train_seconds(out, args.preset, args.epochs, mode, args.every))
                if mode == "log":
                    disk = sum(p.stat().st_size for p in (out / "snapshots").iterdir())
                    n = len(pe_interp.snapshot_steps(out))
                shutil.rmtree(out)
    base, snap = statistics.median(times["none"]), statistics.median(times["log"])
    print(
        f"training ({args.preset}, {args.epochs} epochs): {base:.1f} s without snapshots, {snap:.1f} s with "
        f"{n} snapshots (every {args.every} steps after the powers of two): {100 * (snap / base - 1):+.1f}% "
        f"(goal <= +5%); {disk / 1e6:.1f} MB of snapshots ({disk / n / 1e6:.2f} MB each)"
    )


def training_seconds(seconds: list[float]) -> float:
    """A run's training time from its ``metrics.jsonl`` clock, which restarts at every resume: the
    sum of each segment's last reading."""
    total = 0.0
    for prev, now in zip(seconds, seconds[1:]):
        if now < prev:
            total += prev
    return total + (seconds[-1] if seconds else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--every", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", nargs="*", default=[])
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"CPU native bf16: {cpu_has_bf16()} (every run here is float32), one thread")
    if args.repeats > 0:  # --repeats 0: only the probing of --runs
        training_cost(args)
    for run in args.runs:
        run = Path(run)
        dyn = json.loads((run / "dynamics.json").read_text())
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        probe = sum(r["seconds"] for r in dyn["records"])
        trained = training_seconds([m["seconds"] for m in metrics])
        confirmed = [r for r in dyn["records"] if r["confirmed"]]
        screen_only = [r["seconds"] for r in dyn["records"] if not r["confirmed"]]
        # where the time goes: a snapshot's screen (the grid and routes at the small n), and what
        # confirming open verdicts adds (a confirmed record's time less a screen's median)
        screen = statistics.median(screen_only) if screen_only else float("nan")
        extra = sum(r["seconds"] for r in confirmed) - screen * len(confirmed)
        print(
            f"{run}: {len(dyn['records'])} snapshots ({len(confirmed)} confirmed on 1,000 examples), probing "
            f"{probe:.0f} s against training {trained:.0f} s: {100 * probe / trained:.0f}% (goal <= 50%); "
            f"a screen takes {screen:.0f} s (median), the confirmations add {extra:.0f} s"
        )


if __name__ == "__main__":
    main()

"""``pe-interp dynamics RUN_DIR``: every deposit criterion at every snapshot of a run.

At each snapshot the run kept (``train --snapshots log``) it ablates every head on the same first
``--n`` held-out examples, decides the single-head deposit, layer-0 concentration and the
positional deposit on their intervals, and re-measures on ``--n-confirm`` examples every step
where a verdict is not a clear "no" (:func:`probes.deposit.trajectory.snapshot_dynamics`). It
writes ``RUN_DIR/dynamics.json`` after every snapshot, so a stopped call resumes where it was,
and draws ``RUN_DIR/figures/dynamics.png``.
"""

from __future__ import annotations

import argparse
import time

from pe_interp.commands.options import add_device_flag, device_arg, positive_n

DYNAMICS_JSON = "dynamics.json"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dynamics",
        help="every deposit criterion at every training snapshot of a run",
        description="Ablate every head at every snapshot of a run trained with --snapshots log, and say at which "
        "steps the single-head deposit, layer-0 concentration and the positional deposit hold (yes / no / "
        "undecided, decided on bootstrap intervals). Resumable: rerun to continue.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory trained with --snapshots log")
    p.add_argument("--n", type=int, default=128, help="held-out examples screened at every snapshot (default 128)")
    p.add_argument("--n-confirm", type=int, default=1000,
                   help="examples for every snapshot a verdict is not a clear no at (default 1000)")
    p.add_argument("--n-pairs", type=int, default=128, help="position-only counterfactual pairs screened (default 128)")
    p.add_argument("--steps", type=int, nargs="+", default=None, help="only these snapshot steps")
    p.add_argument("--no-positional", action="store_true", help="skip the positional criterion")
    add_device_flag(p)
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.checkpoint import CheckpointError, split_step
    from pe_interp.io import dir_lock

    for flag, value in (("--n", args.n), ("--n-confirm", args.n_confirm), ("--n-pairs", args.n_pairs)):
        positive_n(value, flag)
    device_arg(args.device)
    run_dir, step = split_step(args.run_dir)
    if step is not None:
        raise ValueError(f"{args.run_dir}: dynamics walks every snapshot of a run; give RUN_DIR without @STEP "
                         f"(--steps {step} for that one)")
    if not (run_dir / "config.json").is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no config.json)")
    with dir_lock(run_dir, "run directory"):
        return _dynamics(args, run_dir)


def _dynamics(args: argparse.Namespace, run_dir) -> int:
    from pe_interp.checkpoint import save_result
    from probes.deposit.trajectory import SnapshotDynamics, snapshot_dynamics

    path = run_dir / DYNAMICS_JSON
    done = SnapshotDynamics.load(path) if path.is_file() else None
    t0 = time.perf_counter()

    def save(result: SnapshotDynamics) -> None:
        save_result(path, result, None, indent=None)

    result = snapshot_dynamics(
        run_dir, n=args.n, n_confirm=args.n_confirm, n_pairs=args.n_pairs, steps=args.steps,
        positional=not args.no_positional, done=done, on_record=save, progress=not args.no_progress,
    )  # fmt: skip
    if args.steps is None:
        save(result)
    print(f"{run_dir}: {len(result.records)} snapshots (steps {result.steps[0]}-{result.steps[-1]}), "
          f"{time.perf_counter() - t0:.1f} s")
    for name, label in (("single_head", "single-head deposit"), ("layer0", "layer-0 concentration"),
                        ("positional", "positional deposit")):
        if all(name in r["verdicts"] for r in result.records):
            held = result.holds(name)
            open_ = [r["step"] for r in result.records if r["verdicts"][name]["verdict"] == "undecided"]
            print(f"{label}: yes at {len(held)} of {len(result.records)} steps"
                  + (f" ({', '.join(map(str, held[:8]))}{' ...' if len(held) > 8 else ''})" if held else "")
                  + (f"; undecided at {len(open_)}" if open_ else ""))
    if not args.no_figures:
        from probes.plots import plot_snapshot_dynamics

        plot_snapshot_dynamics(result, run_dir / "figures" / "dynamics.png")
    print(f"wrote {path}" + ("" if args.no_figures else f", {run_dir / 'figures' / 'dynamics.png'}"))
    return 0

"""``pe-interp dynamics RUN_DIR``: every deposit criterion at every snapshot of a run.

At each snapshot the run kept (``train --snapshots log``) it ablates every head on the same first
``--n`` held-out examples, decides the single-head deposit, layer-0 concentration and the
positional deposit on their intervals, and re-measures on ``--n-confirm`` examples every step
where a verdict is not a clear "no" (:func:`probes.deposit.trajectory.snapshot_dynamics`). It
writes ``RUN_DIR/dynamics.json`` after every snapshot, so a stopped call resumes where it was,
and draws ``RUN_DIR/figures/dynamics.png``.

Another's training checkpoints walk the same way, in language-model form on ``--task``: a hub
model's revisions (``pe-interp dynamics EleutherAI/pythia-70m --task distance --revisions step0
step1000 ...``, where the hub is reachable; results under ``runs/hub/``), or a directory holding
one saved model per revision (``DIR/step0/``, ``DIR/step1000/``, ... each written by
``save_pretrained``; every one by default). A revision's step is its trailing number (``step1000``
is step 1000), else its place in the list.
"""

from __future__ import annotations

import argparse
import re
import time
from functools import partial
from pathlib import Path
from typing import Any

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
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory trained with --snapshots log (or a directory "
        "of saved checkpoints DIR/<revision>/, or a hub name, with --task)",
    )
    p.add_argument(
        "--n",
        type=int,
        default=128,
        help="held-out examples screened at every snapshot (default 128)",
    )
    p.add_argument(
        "--n-confirm",
        type=int,
        default=1000,
        help="examples for every snapshot a verdict is not a clear no at (default 1000)",
    )
    p.add_argument(
        "--n-pairs",
        type=int,
        default=128,
        help="position-only counterfactual pairs screened (default 128)",
    )
    p.add_argument("--steps", type=int, nargs="+", default=None, help="only these snapshot steps")
    p.add_argument("--no-positional", action="store_true", help="skip the positional criterion")
    p.add_argument(
        "--task",
        default=None,
        help="for saved Hugging Face checkpoints: the task, in language-model form",
    )
    p.add_argument(
        "--preset",
        default="quick",
        help="for saved Hugging Face checkpoints: the task's size (default quick)",
    )
    p.add_argument(
        "--revisions",
        nargs="+",
        default=None,
        metavar="REV",
        help="the checkpoints to walk: hub revisions (e.g. step0 step1000), or subdirectories of RUN_DIR",
    )
    add_device_flag(p)
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.runs.checkpoint import CheckpointError, split_step
    from pe_interp.runs.model_dirs import is_gguf_file, is_hub_name, is_model_dir
    from pe_interp.util.io import dir_lock

    for flag, value in (
        ("--n", args.n),
        ("--n-confirm", args.n_confirm),
        ("--n-pairs", args.n_pairs),
    ):
        positive_n(value, flag)
    device_arg(args.device)
    path = Path(args.run_dir)
    revisions = (
        path.is_dir()
        and not (path / "config.json").is_file()
        and any(is_model_dir(d) for d in path.iterdir())
    )
    if (
        args.task is not None
        or args.revisions is not None
        or is_hub_name(args.run_dir)
        or is_model_dir(path)
        or is_gguf_file(path)
        or revisions
    ):
        out, snapshots = _revisions(args)
        with dir_lock(out, "results directory"):
            return _dynamics(args, out, snapshots)
    run_dir, step = split_step(args.run_dir)
    if step is not None:
        raise ValueError(
            f"{args.run_dir}: dynamics walks every snapshot of a run; give RUN_DIR without @STEP "
            f"(--steps {step} for that one)"
        )
    if not (run_dir / "config.json").is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no config.json)")
    with dir_lock(run_dir, "run directory"):
        return _dynamics(args, run_dir)


def revision_steps(revisions: list[str]) -> list[int]:
    """Each revision's trailing number (``step1000``: 1000) where all have distinct ones, else their
    places in the list."""
    numbers = [re.search(r"(\d+)$", r) for r in revisions]
    steps = [int(m[1]) for m in numbers if m]
    return steps if len(steps) == len(revisions) == len(set(steps)) else list(range(len(revisions)))


def _revisions(args: argparse.Namespace) -> tuple[Path, list[Any]]:
    """Where the results go, and a :class:`~probes.deposit.trajectory.Snapshot` per revision."""
    from pe_interp.runs.model_dirs import (
        HUB_RUNS,
        is_gguf_file,
        is_hub_name,
        is_model_dir,
        load_model_dir,
    )
    from probes.deposit.trajectory import Snapshot

    name, device = args.run_dir, device_arg(args.device)
    path = Path(name)
    if is_model_dir(path) or is_gguf_file(path):
        raise ValueError(
            f"{path}: one saved model has no training snapshots; give a directory of its revisions "
            "(DIR/step0/, DIR/step1000/, ... each saved with save_pretrained) or a hub name with "
            "--revisions"
        )
    if args.task is None:
        raise ValueError(
            f"{name}: saved Hugging Face checkpoints, not a pe-interp run: say which task to probe them on "
            "with --task (and --preset for its size)"
        )
    if is_hub_name(name):
        if not args.revisions:
            raise ValueError(
                f"{name}: name the hub revisions to walk, in training order (--revisions step0 step1000 ...)"
            )
        out, revisions = HUB_RUNS / name.replace("/", "__"), list(args.revisions)
        out.mkdir(parents=True, exist_ok=True)
        load = lambda r: load_model_dir(name, args.task, args.preset, device=device, revision=r)  # noqa: E731
    else:
        if not path.is_dir():
            raise ValueError(f"{path}: no such directory")
        found = sorted(
            (d.name for d in path.iterdir() if is_model_dir(d)),
            key=lambda r: (revision_steps([r]), r),
        )
        revisions = list(args.revisions or found)
        if not revisions:
            raise ValueError(
                f"{path}: no saved Hugging Face model in its subdirectories (DIR/<revision>/config.json)"
            )
        missing = [r for r in revisions if r not in found]
        if missing:
            raise ValueError(
                f"{path}: no saved model for revision(s) {', '.join(missing[:5])}; it holds "
                f"{', '.join(found[:8]) or 'none'}"
            )
        out = path
        load = lambda r: load_model_dir(path / r, args.task, args.preset, device=device)  # noqa: E731
    steps = revision_steps(revisions)
    return out, [Snapshot(s, partial(load, r), None, r) for s, r in zip(steps, revisions)]


def _dynamics(args: argparse.Namespace, run_dir, snapshots: list[Any] | None = None) -> int:
    from pe_interp.runs.checkpoint import save_result
    from probes.deposit.trajectory import SnapshotDynamics, snapshot_dynamics, walk_snapshots

    path = run_dir / DYNAMICS_JSON
    done = SnapshotDynamics.load(path) if path.is_file() else None
    t0 = time.perf_counter()

    def save(result: SnapshotDynamics) -> None:
        save_result(path, result, None, indent=None)

    how = dict(
        n=args.n,
        n_confirm=args.n_confirm,
        n_pairs=args.n_pairs,
        positional=not args.no_positional,
        done=done,
        on_record=save,
        progress=not args.no_progress,
    )
    if snapshots is None:
        result = snapshot_dynamics(run_dir, steps=args.steps, **how)
    else:
        if args.steps is not None:
            raise ValueError(
                "--steps picks a run's snapshots; for checkpoints, name them with --revisions"
            )
        result = walk_snapshots(snapshots, **how)
    if args.steps is None:
        save(result)
    print(
        f"{run_dir}: {len(result.records)} snapshots (steps {result.steps[0]}-{result.steps[-1]}), "
        f"{time.perf_counter() - t0:.1f} s"
    )
    for name, label in (
        ("single_head", "single-head deposit"),
        ("layer0", "layer-0 concentration"),
        ("positional", "positional deposit"),
    ):
        if all(name in r["verdicts"] for r in result.records):
            held = result.holds(name)
            open_ = [
                r["step"] for r in result.records if r["verdicts"][name]["verdict"] == "undecided"
            ]
            print(
                f"{label}: yes at {len(held)} of {len(result.records)} steps"
                + (
                    f" ({', '.join(map(str, held[:8]))}{' ...' if len(held) > 8 else ''})"
                    if held
                    else ""
                )
                + (f"; undecided at {len(open_)}" if open_ else "")
            )
    if not args.no_figures:
        from probes.deposit.view import plot_snapshot_dynamics

        plot_snapshot_dynamics(result, run_dir / "figures" / "dynamics.png")
    print(
        f"wrote {path}" + ("" if args.no_figures else f", {run_dir / 'figures' / 'dynamics.png'}")
    )
    return 0

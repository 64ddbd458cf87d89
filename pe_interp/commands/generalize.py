"""``pe-interp generalize RUN_DIR``: length generalisation of a trained run.

Scores the run's model, with the same labels, on inputs longer than any it was trained on: the
decisive tokens translated beyond the trained positions (``shift``), more filler on both sides
(``sides``), more after them (``right``), or (task 2) longer sequences with counts in the trained
range (``length``), up to twice the training length by default. Rows equal to a training row are
left out. Writes ``RUN_DIR/generalization.json`` (``--out`` elsewhere) and prints one line per
condition.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pe_interp.commands.destinations import writing_run
from pe_interp.commands.options import add_device_flag, device_arg, positive_n, seed_type


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generalize",
        help="accuracy on longer inputs than training (translated, lengthened)",
        description="Score a trained run on inputs it never saw, with the same labels: translated beyond the "
        "trained positions, and longer (up to 2x the training length by default). Encodings whose trained "
        "parameters have one entry per position (a learned table) are reported as not evaluated beyond n_ctx.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory written by `pe-interp train`"
    )
    p.add_argument("--n", type=int, default=1000, help="rows per condition (default 1000)")
    p.add_argument(
        "--extras",
        type=int,
        nargs="+",
        default=None,
        help="how many tokens longer (default: 1/4, 1/2, 3/4 and all of the training length)",
    )
    p.add_argument(
        "--families",
        nargs="+",
        default=None,
        help="shift | sides | right (tasks 1 and 3), length (task 2); default: every one of the task's",
    )
    p.add_argument(
        "--seed", type=seed_type, default=None, help="seeds the rows (default: the run's seed)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="where to write the result (default RUN_DIR/generalization.json)",
    )
    add_device_flag(p, default="cpu")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    positive_n(args.n, "--n")
    if args.extras is not None and any(e < 1 for e in args.extras):
        raise ValueError(
            f"--extras must be positive integers, got {' '.join(map(str, args.extras))}"
        )
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    from pe_interp.runs.checkpoint import STEPS_DIR, split_step

    run_dir, step = split_step(args.run_dir)
    at = run_dir if step is None else run_dir / STEPS_DIR / str(step)  # RUN@S: the step's results
    out = Path(args.out) if args.out is not None else at / "generalization.json"
    if out.is_dir():
        raise ValueError(f"--out {out}: is a directory; give a file name")
    lock = (
        None if args.out is None else str(out.parent)
    )  # --out elsewhere: its directory is the one written
    with writing_run(args.run_dir, device=device_arg(args.device), out=lock) as loaded:
        return _generalize(args, loaded, out)


def _generalize(args: argparse.Namespace, loaded, out: Path) -> int:
    from pe_interp.runs.checkpoint import save_result
    from probes.generalization import length_generalization

    if args.families is not None:
        for family in args.families:
            try:
                loaded.task.extended(family, 0)
            except ValueError as err:
                raise ValueError(f"--families: {err}") from None
    cfg = loaded.train_cfg
    train, _ = loaded.task.splits(cfg.n_train, cfg.n_test, seed=cfg.seed)
    t0 = time.perf_counter()
    result = length_generalization(
        loaded.model,
        loaded.task,
        n=args.n,
        extras=args.extras,
        families=args.families,
        exclude=train,
        ignore_index=cfg.ignore_index,
        seed=cfg.seed if args.seed is None else args.seed,
        progress=not args.no_progress,
    )
    save_result(out, result, loaded.provenance)
    print(result.summary())
    print(f"{time.perf_counter() - t0:.1f} s; wrote {out}")
    return 0

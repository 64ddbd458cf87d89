"""``pe-interp routes RUN_DIR``: where position enters, and the positional deposit verdict.

Builds the run's task's position-only counterfactual pairs (the same tokens moved, so only
position changes the label), lets one positional route at a time see the moved positions
(:func:`probes.route_shares`), prints each route's share of the positional effect with its
interval and the positional deposit verdict (:func:`probes.positional_dominance`: yes, no, or
undecided with how many pairs would decide it), and writes ``RUN_DIR/routes.json``.

Exit status: 0 when the verdict is decided (yes or no), 3 when it is undecided.
"""

from __future__ import annotations

import argparse
import time

from pe_interp.commands.destinations import writing_run
from pe_interp.commands.options import (
    add_device_flag,
    add_model_dir_flags,
    at_least,
    bootstrap_arg,
    device_arg,
    model_dir_arg,
    positive_n,
    seed_type,
)

UNDECIDED_EXIT = 3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "routes",
        help="where position enters: each positional route's share, and the positional deposit verdict",
        description="Move the tokens of held-out examples (position-only counterfactual pairs), let one "
        "positional route (a rotated or biased head, or the residual stream for absolute encodings) at a "
        "time see the moved positions, and say whether one route carries the positional effect "
        f"(>= 50%%, every other within ±5%%). Exits {UNDECIDED_EXIT} when the intervals cannot decide it.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory written by `pe-interp train` (RUN@STEP: a snapshot)",
    )
    p.add_argument("--n", type=int, default=512, help="position-only pairs (default 512)")
    p.add_argument(
        "--seed",
        type=seed_type,
        default=0,
        help="seeds the pairs (offset from the run's seed) and the bootstrap",
    )
    p.add_argument(
        "--n-bootstrap",
        type=int,
        default=1000,
        help="bootstrap replicates for the intervals (>= 1)",
    )
    p.add_argument(
        "--screen",
        type=int,
        default=None,
        metavar="K",
        help="estimate every head's share by attribution and measure only the K largest exactly "
        "(a model with many heads: SmolLM2's 270 cost ~146 forwards of the pairs exhaustively); "
        "the others are printed as estimates and the verdict says how many were measured",
    )
    add_device_flag(p)
    add_model_dir_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    positive_n(args.n, "--n")
    at_least(args.n_bootstrap, 1, "--n-bootstrap")
    bootstrap_arg(args.n_bootstrap, zero_ok=False)
    if args.screen is not None:
        at_least(args.screen, 1, "--screen")
    with writing_run(args.run_dir, device=device_arg(args.device), **model_dir_arg(args)) as loaded:
        return _routes(args, loaded)


def _routes(args: argparse.Namespace, loaded) -> int:
    from pe_interp.runs.checkpoint import save_result
    from probes.deposit.positional import positional_dominance
    from probes.deposit.trajectory import PAIRS_SEED_OFFSET
    from probes.routes.shares import route_shares

    pairs = loaded.task.counterfactuals(
        args.n, kind="position", seed=loaded.train_cfg.seed + PAIRS_SEED_OFFSET + args.seed
    )
    if not bool((pairs.clean.labels != pairs.corrupt.labels).any()):
        raise ValueError(
            f"{loaded.name}: moving the tokens changes no label of task {loaded.task.name!r}: "
            "position decides nothing there, so no route can carry it"
        )
    t0 = time.perf_counter()
    r = route_shares(
        loaded.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.clean.pad_mask,
        n_bootstrap=args.n_bootstrap,
        seed=args.seed,
        screen=args.screen,
        progress=True,
    )
    p = positional_dominance(r)
    path = save_result(loaded.result_dir / "routes.json", r, loaded.provenance)
    print(
        f"{loaded.name}: {r.n_examples} position-only pairs, {loaded.model.cfg.encoding_name}, "
        f"{time.perf_counter() - t0:.1f} s"
    )
    print(f"positional effect: {r.effect:.3f} logits [{r.effect_ci[0]:.3f}, {r.effect_ci[1]:.3f}]")
    for name, share, lo, hi in r.units()[:6]:
        print(f"  {name:<8} {100 * share:6.1f}% [{100 * lo:6.1f}, {100 * hi:6.1f}]")
    if r.screened:
        print(
            f"  ({int(r.measured.sum())} of {int(r.routes.sum())} routes measured exactly; the "
            f"largest estimate of the others: {100 * r.unmeasured_max():.1f}%)"
        )
    print(p.text())
    print(f"wrote {path}")
    return UNDECIDED_EXIT if p.verdict == "undecided" else 0

"""``pe-interp ablate RUN_DIR``: the single-head ablation sweep of a trained run.

Evaluates on the run's held-out split (``--on all``: training and held-out sets together, the
authors' protocol), writes ``RUN_DIR/ablation.json`` and
``RUN_DIR/deposits.json``, draws ``RUN_DIR/figures/ablation_heatmap.png`` and
``ablation_layers.png``, and prints one row per layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

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

UNDECIDED_EXIT = 3  # the exit status of a verdict the intervals cannot decide (--verdict)
VERDICTS = {"single": "single-head deposit", "layer0": "layer-0 concentration"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ablate",
        help="ablate each attention head: single-head deposit and layer concentration",
        description="Ablate each attention head of a trained run on its held-out set, one at a time; say "
        "whether the model has a single-head deposit (one head costs >= 50 points, every other moves accuracy "
        "by <= 5 either way) and flag the layers where one head carries most of its layer (layer concentration).",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory written by `pe-interp train`"
    )
    p.add_argument("--method", choices=["zero", "mean", "resample"], default="zero")
    p.add_argument("--metric", choices=["accuracy", "loss", "logit"], default="accuracy")
    p.add_argument(
        "--n", type=int, default=None, help="examples to use (default: all of the evaluation set)"
    )
    p.add_argument(
        "--on",
        choices=["test", "all"],
        default="test",
        help="evaluate on the held-out split (default) or on train + test, as the authors did",
    )
    p.add_argument(
        "--layers", type=int, nargs="+", default=None, help="layers to sweep (default: all)"
    )
    p.add_argument(
        "--seed", type=seed_type, default=0, help="seeds the bootstrap and resample sources"
    )
    p.add_argument(
        "--n-bootstrap", type=int, default=1000, help="bootstrap replicates for the CIs (0: none)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows per forward (default 128 on CPU, 2048 on GPU)",
    )
    add_device_flag(p)
    add_model_dir_flags(p)
    p.add_argument(
        "--min-drop",
        type=float,
        default=None,
        help="layer-concentration threshold on the top head's drop (default 0.2 for accuracy)",
    )
    p.add_argument(
        "--min-share",
        type=float,
        default=0.5,
        help="layer-concentration threshold on the top head's share of its layer",
    )
    p.add_argument(
        "--verdict",
        choices=list(VERDICTS),
        default=None,
        help="ask only for one verdict, decided on the bootstrap intervals: print it and exit 0 when "
        f"it is decided (yes or no), {UNDECIDED_EXIT} when the intervals cannot decide it",
    )
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from probes.common.inputs import check_fraction, check_threshold

    run_dir = Path(args.run_dir)
    positive_n(args.n, "--n")
    at_least(args.n_bootstrap, 0, "--n-bootstrap")
    bootstrap_arg(args.n_bootstrap)
    if args.method in ("mean", "resample") and args.n is not None and args.n < 2:
        raise ValueError(
            f"--method {args.method} with --n {args.n}: {args.method} ablation replaces a head's "
            "output with other examples' (their mean, or another example's), so it needs at "
            "least 2 examples (with one, every drop would be exactly 0)"
        )
    if args.min_drop is not None:
        check_threshold(args.min_drop, "--min-drop")
    check_fraction(
        args.min_share, "--min-share"
    )  # what find_deposits takes, checked before the sweep
    if args.verdict is not None:
        if args.n_bootstrap < 1:
            raise ValueError(
                "--verdict is decided on bootstrap intervals: --n-bootstrap must be >= 1"
            )
        if args.metric != "accuracy" or args.layers is not None:
            raise ValueError(
                "--verdict needs the accuracy grid of every layer: drop --metric and --layers"
            )
    with writing_run(run_dir, device=device_arg(args.device), **model_dir_arg(args)) as loaded:
        return _ablate(args, loaded.result_dir, loaded)


def _ablate(args: argparse.Namespace, run_dir: Path, loaded) -> int:
    import numpy as np

    from pe_interp.runs.checkpoint import save_result
    from probes.ablation import ablate_heads
    from probes.deposit import dominance, find_deposits, too_few

    model = loaded.model
    test = loaded.examples(args.on, args.n)
    t0 = time.perf_counter()
    result = ablate_heads(
        model,
        test.tokens,
        test.labels,
        pad_mask=test.pad_mask,
        method=args.method,
        metric=args.metric,
        layers=args.layers,
        n_bootstrap=args.n_bootstrap,
        seed=args.seed,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    elapsed = time.perf_counter() - t0
    result = dataclasses.replace(result, meta={**result.meta, "eval_set": args.on})
    report = find_deposits(result, min_drop=args.min_drop, min_share=args.min_share)
    save_result(run_dir / "ablation.json", result, loaded.provenance, per_example=False)
    save_result(run_dir / "deposits.json", report, loaded.provenance)
    if not args.no_figures:
        from probes.ablation.view import plot_drop_heatmap, plot_layer_lines

        fig_dir = run_dir / "figures"
        plot_drop_heatmap(result, fig_dir / "ablation_heatmap.png", deposits=report.deposits)
        plot_layer_lines(result, fig_dir / "ablation_layers.png")
    where = "held-out" if args.on == "test" else "train + held-out"
    print(
        f"{loaded.name}: {result.n_examples} {where} examples, {model.cfg.encoding_name}, {elapsed:.1f} s"
    )
    print(report.summary())
    if result.is_grid and not np.isnan(result.drops).any() and result.metric == "accuracy":
        few = too_few(result)  # a verdict from a handful of examples is no verdict
        print(f"single-head deposit: {(few or dominance(result)).text()}")
        if result.n_bootstrap > 0:
            from probes.deposit import decide_concentration, decide_single

            print(
                f"  on its intervals: single-head deposit {decide_single(result).text()}; layer-0 concentration "
                f"{decide_concentration(result, 0).text()}"
            )
    found = ", ".join(f"L{layer}H{h}" for layer, h in report.deposits) or "none"
    print(f"layer concentration: {found}")
    print(
        f"wrote {run_dir / 'ablation.json'}, {run_dir / 'deposits.json'}"
        + ("" if args.no_figures else f", {run_dir / 'figures'}/")
    )
    if args.verdict is None:
        return 0
    from probes.deposit import decide_concentration, decide_single

    decision = (
        decide_single(result) if args.verdict == "single" else decide_concentration(result, 0)
    )
    print(f"{VERDICTS[args.verdict]}: {decision.text()}")
    return UNDECIDED_EXIT if decision.verdict == "undecided" else 0

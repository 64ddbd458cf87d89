"""``pe-interp train`` and ``pe-interp eval``.

``train`` has a flag for every field of ModelConfig, TrainConfig and the tasks, generated from the
dataclasses (:mod:`pe_interp.commands.options`), so the command line can build any model the
Python API can, the authors' included.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pe_interp.commands.destinations import out_dir_arg
from pe_interp.commands.options import (
    add_device_flag,
    add_setting_flags,
    device_arg,
    given_settings,
    positive_n,
    seed_type,
)
from pe_interp.config.presets import PRESETS
from pe_interp.tasks import TASKS

ENCODING_HELP = (
    "a registered name, a '+'-joined composition, parts with parameters "
    "(e.g. 'sinusoidal(layout=concat)+rope(base=500)', 'rope(heads=(0,1))'), or JSON "
    '(e.g. \'{"name": "alibi", "slopes": "authors"}\')'
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train one model on one task",
        description="Train one model on one task. Every ModelConfig, TrainConfig and task field has a flag; "
        "a flag not given keeps the preset's value.",
    )
    p.add_argument("--task", choices=list(TASKS), default="distance")
    p.add_argument("--encoding", default="rope", help=ENCODING_HELP)
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument(
        "--seed", type=seed_type, default=0, help="seeds the model, the data and the training order"
    )
    p.add_argument(
        "--out", required=True, help="run directory (new, or an interrupted run with --resume)"
    )
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    p.add_argument(
        "--authors-quirks",
        action="store_true",
        help="the authors' code: every fidelity switch (no pad mask, K/V from the input, ReLU, no final "
        "norm, torch init, their dropout, optimiser and schedule, data details); flags given override it",
    )
    add_device_flag(p, default="cpu")
    p.add_argument("--no-progress", action="store_true")
    names = add_setting_flags(p)
    p.set_defaults(run=run_train, setting_names=names)

    e = sub.add_parser(
        "eval",
        help="held-out accuracy of a trained run",
        description="Evaluate a run on its held-out split.",
    )
    e.add_argument("run_dir", metavar="RUN_DIR")
    e.add_argument("--n", type=int, default=None, help="evaluate on the first N held-out examples")
    add_device_flag(e, default="cpu")
    e.set_defaults(run=run_eval)


def train_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`pe_interp.train` that ``pe-interp train ARGS`` calls it with."""
    return dict(
        task=args.task,
        encoding=args.encoding,
        preset=args.preset,
        seed=args.seed,
        authors_quirks=args.authors_quirks,
        **given_settings(args, args.setting_names),
        device=device_arg(args.device),
    )


def run_train(args: argparse.Namespace) -> int:
    from pe_interp.api import train

    out = Path(out_dir_arg(args.out))
    if args.resume and not (out / "config.json").is_file():
        raise ValueError(
            f"--resume: {out} holds no run to resume"
            + ("" if out.exists() else " (no such directory)")
            + "; drop --resume to start one"
        )
    kwargs = train_kwargs(
        args
    )  # the Trainer checks what neither config checks alone, before any work
    result = train(out=args.out, resume=args.resume, progress=not args.no_progress, **kwargs)
    print(json.dumps({"run_dir": str(result.run_dir), **result.final}))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from pe_interp.runs.checkpoint import load_run
    from pe_interp.training.trainer import evaluate

    positive_n(args.n)
    run = load_run(args.run_dir, device=device_arg(args.device))
    test = run.test_set(args.n)
    metrics = evaluate(run.model, test, ignore_index=run.train_cfg.ignore_index)
    print(
        json.dumps(
            {
                "run_dir": str(run.run_dir),
                "n": len(test),
                "test_acc": metrics["acc"],
                "test_loss": metrics["loss"],
            }
        )
    )
    return 0

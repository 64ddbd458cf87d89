"""``pe-interp train`` and ``pe-interp eval``."""

from __future__ import annotations

import argparse
import json

from pe_interp.presets import PRESETS

# (flag, field, type, help): per-field overrides routed to the model, train or task config.
OVERRIDES = [
    ("--n-layers", "n_layers", int, "transformer blocks"),
    ("--d-model", "d_model", int, "residual width"),
    ("--n-heads", "n_heads", int, "attention heads per layer"),
    ("--d-head", "d_head", int, "head width (default d_model / n_heads)"),
    ("--d-mlp", "d_mlp", int, "MLP width (0: attention-only)"),
    ("--dropout", "dropout", float, "residual dropout"),
    ("--attn-backend", "attn_backend", str, "auto | eager | sdpa | triton"),
    ("--attention-dir", "attention_dir", str, "bidirectional | causal"),
    ("--kv-source", "kv_source", str, "residual | embed (the authors' K/V from the input)"),
    ("--epochs", "epochs", int, "training epochs"),
    ("--batch-size", "batch_size", int, "training batch size"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--n-train", "n_train", int, "training examples"),
    ("--n-test", "n_test", int, "held-out examples"),
    ("--eval-every", "eval_every", int, "steps between evaluations (0: per epoch)"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints (0: per epoch)"),
    ("--device", "device", str, "cpu | cuda"),
    ("--max-between", "max_between", int, "task 1: largest number of tokens between the triggers"),
    ("--max-side", "max_side", int, "task 1: largest number of tokens on each side"),
    ("--max-len", "max_len", int, "task 1: truncation length"),
    ("--d-vocab", "d_vocab", int, "vocabulary size"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one model on one task", description="Train one model on one task.")
    p.add_argument("--task", choices=["distance", "count"], default="distance")
    p.add_argument("--encoding", default="rope", help="registered name or '+'-joined composition (e.g. sinusoidal+rope)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument("--authors-quirks", action="store_true", help="reproduce the authors' code: no pad mask, K/V from the input, betas (0.98, 0.9), triggers as fillers")
    p.add_argument("--mask-padding", dest="mask_padding", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--no-progress", action="store_true")
    for flag, dest, typ, help_ in OVERRIDES:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    p.set_defaults(run=run_train)

    e = sub.add_parser("eval", help="held-out accuracy of a trained run", description="Evaluate a run on its held-out split.")
    e.add_argument("run_dir")
    e.add_argument("--n", type=int, default=None, help="evaluate on the first N held-out examples")
    e.add_argument("--device", default="cpu")
    e.set_defaults(run=run_eval)


def run_train(args: argparse.Namespace) -> int:
    from pe_interp.api import train

    overrides = {dest: getattr(args, dest) for _, dest, _, _ in OVERRIDES}
    overrides["mask_padding"] = args.mask_padding
    result = train(
        task=args.task,
        encoding=args.encoding,
        preset=args.preset,
        seed=args.seed,
        out=args.out,
        resume=args.resume,
        progress=not args.no_progress,
        authors_quirks=args.authors_quirks,
        **overrides,
    )
    print(json.dumps({"run_dir": str(result.run_dir), **result.final}))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from pe_interp.checkpoint import load_run
    from pe_interp.training import evaluate

    run = load_run(args.run_dir, device=args.device)
    test = run.test_set(args.n)
    metrics = evaluate(run.model, test)
    print(json.dumps({"run_dir": str(run.run_dir), "n": len(test), "test_acc": metrics["acc"], "test_loss": metrics["loss"]}))
    return 0

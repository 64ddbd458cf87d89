"""``pe-interp heads RUN_OR_MODEL_DIR``: every head's positional type, named and scored.

Scores every head of the model on ``--n`` held-out examples (:func:`probes.heads.types.head_type_scores`:
previous-token, duplicate-token, induction and first-token (attention sink) scores, the first
three equal to TransformerLens' ``detect_head``), prints the top heads of each type and which
heads are of it, and writes ``head_types.json`` (and ``figures/head_types.png``) into the run
directory (a saved Hugging Face model directory or GGUF file with ``--task``).
"""

from __future__ import annotations

import argparse
import time

from pe_interp.commands.destinations import writing_run
from pe_interp.commands.options import (
    add_device_flag,
    add_model_dir_flags,
    at_least,
    device_arg,
    model_dir_arg,
    positive_n,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "heads",
        help="every head's type: previous-token, duplicate-token, induction, first-token (sink)",
        description="Score every head as a previous-token, duplicate-token, induction and "
        "first-token (attention sink) head on held-out examples (TransformerLens' detect_head "
        "scores, batched), print the top heads of each type, and write head_types.json.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_OR_MODEL_DIR",
        help="a run directory written by `pe-interp train` (RUN@STEP: a snapshot), or a saved "
        "Hugging Face model directory or GGUF file with --task",
    )
    p.add_argument("--n", type=int, default=256, help="held-out examples (default 256)")
    p.add_argument("--batch-size", type=int, default=16, help="examples per forward (default 16)")
    p.add_argument("--top", type=int, default=5, help="heads printed per type (default 5)")
    p.add_argument("--no-figures", action="store_true", help="do not draw figures/head_types.png")
    add_device_flag(p)
    add_model_dir_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    positive_n(args.n, "--n")
    at_least(args.batch_size, 1, "--batch-size")
    at_least(args.top, 0, "--top")
    with writing_run(args.run_dir, device=device_arg(args.device), **model_dir_arg(args)) as loaded:
        return _heads(args, loaded)


def _heads(args: argparse.Namespace, loaded) -> int:
    from pe_interp.runs.checkpoint import save_result
    from probes.heads.types import HEAD_TYPES, head_type_scores

    test = loaded.examples("test", args.n)
    t0 = time.perf_counter()
    r = head_type_scores(loaded.model, test.tokens, test.pad_mask, batch_size=args.batch_size)
    path = save_result(loaded.result_dir / "head_types.json", r, loaded.provenance)
    print(
        f"{loaded.name}: {r.n_examples} held-out examples, {loaded.model.cfg.encoding_name}, "
        f"{r.n_forwards} forwards, {time.perf_counter() - t0:.1f} s"
    )
    for kind in HEAD_TYPES:
        typed = r.types()[kind]
        print(
            f"{kind}: {len(typed)} head(s) with focus >= {r.thresholds[kind]:g} "
            f"(coverage {r.coverage[kind]:.3f})"
        )
        for (layer, head), score in r.top(kind, args.top):
            mark = "  *" if (layer, head) in typed else ""
            print(
                f"  L{layer}H{head:<3} score {score:.3f}  focus {float(r.focus[kind][layer, head]):.3f}"
                + mark
            )
    if not args.no_figures:
        from probes.heads.view import plot_head_types

        png = loaded.result_dir / "figures" / "head_types.png"
        plot_head_types(r, png)
        print(f"wrote {png}")
    print(f"wrote {path}")
    return 0

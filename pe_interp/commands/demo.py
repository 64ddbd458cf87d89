"""``pe-interp demo``: the main job end to end in about ten minutes on a 2-core CPU.

RoPE and two controls (sinusoidal, NoPE) on task 1 at the ``quick`` size (4 epochs instead of 6),
one seed each, then the full head-ablation grid with deposit detection, head patching, positional
scores, attention patterns and the top head's logit terms; every committed checkpoint (``checkpoints/*/``) is
opened up the same way. Writes ``report.html``, whose first screen answers "is there a
single-head deposit, and where?", and prints where it is. Resumable: a rerun skips finished work.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pe_interp.presets import PRESETS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="RoPE and controls on task 1, every probe, report.html (about 10 minutes on 2 cores)",
        description="The ten-minute demo: train RoPE, sinusoidal and NoPE on task 1, ablate every head, find "
        "deposits, patch heads, decompose the top head's logits, open up committed checkpoints, and write report.html.",
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick", help="model size (default quick)")
    p.add_argument("--encodings", nargs="+", default=None, help="encodings to train (default rope sinusoidal nope)")
    p.add_argument("--checkpoints", default="checkpoints",
                   help="directory of committed run directories to open up too (default checkpoints/; '' for none)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per model, so that they finish together)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.options import out_dir_arg, positive_n
    from pe_interp.report.data import load_cells
    from pe_interp.report.verdict import deposit_answer, first_task
    from pe_interp.reproduce import demo

    positive_n(args.workers, "--workers")
    out_dir_arg(args.out)
    if args.checkpoints and args.checkpoints != "checkpoints" and not Path(args.checkpoints).is_dir():
        raise ValueError(f"--checkpoints {args.checkpoints}: no such directory ('' for none)")
    t0 = time.time()
    summary, report = demo(args.out, preset=args.preset, encodings=args.encodings,
                           checkpoints=args.checkpoints or None, workers=args.workers, progress=not args.no_progress)
    cells, errors = load_cells(args.out)  # a cell whose results came from other weights is an error there
    task = first_task(cells)
    if task is not None:
        answer, lines = deposit_answer(cells, task)
        print("\nIs there a single-head deposit, and where?\n  " + answer.replace("**", ""))
        for _, line in lines:
            print("  - " + line.replace("**", ""))
    for name, err in summary.failed.items():
        print(f"  FAILED {name}: {err}")
    for e in errors:
        if e.get("stale"):
            print(f"  LEFT OUT {e['id']}: {e['error']}")
    print(f"\nreport: {Path(report).resolve()}")
    print(json.dumps({"out": str(args.out), "done": len(summary.done), "skipped": len(summary.skipped),
                      "failed": summary.failed, "wall_s": round(time.time() - t0, 1)}))
    return 1 if summary.failed else 0

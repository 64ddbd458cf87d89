"""``pe-interp reproduce``: the paper's tables and figures in one command."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="train every encoding on both tasks, probe them, write summary.md and report.html",
        description="Reproduce the paper: runs, probes, summary tables and an offline HTML report. "
        "Resumable: a rerun skips finished runs and probes.",
    )
    p.add_argument("--preset", choices=["smoke", "quick", "paper"], default="quick")
    p.add_argument("--out", default=None, help="output directory (default runs/reproduce-<preset>)")
    p.add_argument(
        "--seeds", type=int, default=None, help="seeds per encoding × task (default 3; smoke 1)"
    )
    p.add_argument("--encodings", nargs="*", default=None, help="subset of encoding labels")
    p.add_argument(
        "--tasks", nargs="*", default=["distance", "count"], choices=["distance", "count"]
    )
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu | cuda (default: the preset's)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild summary.md and report.html from finished runs",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.destinations import out_dir_arg
    from pe_interp.commands.options import device_arg, positive_n
    from pe_interp.report import write_report
    from pe_interp.reproduce import reproduce

    positive_n(args.seeds, "--seeds")
    positive_n(args.workers, "--workers")
    out_dir_arg(args.out)
    if args.device and args.backend == "local":  # else every run would train, then fail on it
        device_arg(args.device)
    out = Path(args.out or Path("runs") / f"reproduce-{args.preset}")
    t0 = time.time()
    if args.report_only:
        write_report(out, preset=args.preset)
        print(f"wrote {out / 'summary.md'} and {out / 'report.html'}")
        return 0
    overrides = {"device": args.device} if args.device else None
    summary, out = reproduce(
        out,
        preset=args.preset,
        seeds=args.seeds,
        encodings=args.encodings,
        tasks=tuple(args.tasks),
        backend=args.backend,
        workers=args.workers,
        progress=not args.no_progress,
        overrides=overrides,
    )
    print((out / "summary.md").read_text())
    print(
        json.dumps(
            {
                "out": str(out),
                "done": len(summary.done),
                "skipped": len(summary.skipped),
                "failed": summary.failed,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )
    return 1 if summary.failed else 0

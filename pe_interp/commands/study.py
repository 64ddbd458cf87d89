"""``pe-interp study FINDINGS_DIR``: the deposit study from its committed findings (one JSON file
per finished cell, written by a sweep whose grid names ``findings``): in ``FINDINGS_DIR/study/``,
``STUDY.md`` (the table by condition with rates and Wilson intervals, the verdict, the table by
model), ``study.json`` and ``dynamics.png`` (layer 0 over training), and, with ``--readme
findings/README.md``, the study's table there. With ``--paired REFERENCE_DIR``, a dynamics study is
compared seed by seed with another over the same seeds (``PAIRED.md``, ``paired.json``,
``paired.png``; the block ``study:NAME-paired``). It only reads the findings, so it can be rerun at
any time, on any machine."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study",
        help="the deposit study's tables, verdict and dynamics figure from its findings",
        description="Read FINDINGS_DIR/*.json (per-cell summaries a sweep wrote) and write STUDY.md, "
        "study.json and dynamics.png into FINDINGS_DIR/study (or --out).",
    )
    p.add_argument("findings", metavar="FINDINGS_DIR")
    p.add_argument("--grid", default=None, help="order the conditions as this grid file's variants")
    p.add_argument("--out", default=None, help="where to write (default: FINDINGS_DIR/study)")
    p.add_argument(
        "--readme",
        default=None,
        help="also replace the block between <!-- study:NAME begin/end --> markers in this file "
        "(NAME: the findings directory's name); the committed studies' blocks are in "
        "findings/README.md",
    )
    p.add_argument(
        "--paired",
        metavar="REFERENCE_DIR[:CONDITION]",
        default=None,
        help="compare this dynamics study's base condition, seed by seed, with CONDITION (default: base) "
        "of the dynamics study in REFERENCE_DIR (the same seeds, one setting changed)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.report.findings import (
        condition_rows,
        markdown,
        model_rows,
        study_dynamics_figure,
        to_json,
        update_readme,
        verdict,
    )
    from pe_interp.sweep import load_grid
    from pe_interp.sweep.findings import load_findings
    from pe_interp.util.io import atomic_write_text

    src = Path(args.findings)
    findings = load_findings(src)
    if not findings:
        raise ValueError(f"{src}: no findings yet (a sweep writes one per finished cell)")
    order = None
    if args.grid:
        grid = load_grid(args.grid)
        order = [grid.condition(c) for c in grid.cells()]
    out = Path(args.out) if args.out else src / "study"
    out.mkdir(parents=True, exist_ok=True)
    from pe_interp.report.trajectories import has_snapshots

    if args.paired:
        return _paired(args, src, findings, out)
    if has_snapshots(findings):  # a study over training: every criterion at every snapshot
        return _trajectories(args, src, findings, order, out)
    models = model_rows(findings)
    conds = condition_rows(models, order)
    table = markdown(conds, models)
    fig = study_dynamics_figure(findings, out / "dynamics.png", order)
    atomic_write_text(
        out / "STUDY.md",
        f"# The deposit study: {src.name}\n\n{table}"
        + ("\n![layer 0 over training](dynamics.png)\n" if fig else ""),
    )
    atomic_write_text(out / "study.json", to_json(conds, models))
    print(verdict(conds, models))
    print(f"wrote {out / 'STUDY.md'}, {out / 'study.json'}" + (f" and {fig}" if fig else ""))
    if args.readme:
        short = table.split("\n\nPer model:")[0]
        block = (
            f"{short}\n\nFrom `{src}` ({len(findings)} findings; `pe-interp study {src} --readme "
            f"{args.readme}` regenerates this table, the per-model table is in `{out}/STUDY.md`)."
        )
        if not update_readme(args.readme, src.name, block):
            raise ValueError(
                f"{args.readme}: no <!-- study:{src.name} begin --> / <!-- study:{src.name} end --> markers"
            )
        print(f"updated {args.readme}")
    return 0


def _trajectories(
    args: argparse.Namespace, src: Path, findings: list, order: list | None, out: Path
) -> int:
    import json

    from pe_interp.report.findings import update_readme
    from pe_interp.report.trajectories import (
        trajectory_figure,
        trajectory_markdown,
        trajectory_rows,
    )
    from pe_interp.util.io import atomic_write_text

    rows = trajectory_rows(findings, order)
    table = trajectory_markdown(rows, str(src))
    fig = trajectory_figure(rows, findings, out / "dynamics.png")
    atomic_write_text(
        out / "STUDY.md",
        f"# The deposit over training: {src.name}\n\n{table}\n"
        + ("\n![every seed over training](dynamics.png)\n" if fig else ""),
    )
    atomic_write_text(out / "study.json", json.dumps({"conditions": rows}, indent=1, default=float))
    print(table)
    if args.readme:
        if not update_readme(args.readme, src.name, table):
            raise ValueError(
                f"{args.readme}: no <!-- study:{src.name} begin --> / <!-- study:{src.name} end --> markers"
            )
        print(f"updated {args.readme}")
    print(f"wrote {out / 'STUDY.md'}, {out / 'study.json'}" + (f" and {fig}" if fig else ""))
    return 0


def _paired(args: argparse.Namespace, src: Path, findings: list, out: Path) -> int:
    import json

    from pe_interp.report.findings import update_readme
    from pe_interp.report.paired import paired_figure, paired_markdown, paired_rows, unpaired
    from pe_interp.sweep.findings import load_findings
    from pe_interp.util.io import atomic_write_text

    ref_dir, _, ref_condition = args.paired.rpartition(":")
    if (
        Path(args.paired).is_dir() or not ref_dir
    ):  # no condition given (a colon inside the path is the path's)
        ref_dir, ref_condition = args.paired, ""
    reference = load_findings(ref_dir)
    if not reference:
        raise ValueError(f"{ref_dir}: no findings to compare with")
    rows = paired_rows(findings, reference, ref_condition=ref_condition or "base")
    table = paired_markdown(
        rows,
        str(src),
        ref_dir,
        unpaired(findings, reference, ref_condition=ref_condition or "base"),
    )
    fig = paired_figure(rows, out / "paired.png")
    atomic_write_text(
        out / "PAIRED.md",
        f"# {src.name} against {Path(ref_dir).name}, seed by seed\n\n{table}\n"
        + ("\n![layer 0 over training, paired by seed](paired.png)\n" if fig else ""),
    )
    keep = [{"seed": r["seed"], "test": r["test"], "reference": r["reference"]} for r in rows]
    atomic_write_text(out / "paired.json", json.dumps({"pairs": keep}, indent=1, default=float))
    print(table)
    if args.readme:
        name = f"{src.name}-paired"
        if not update_readme(args.readme, name, table):
            raise ValueError(
                f"{args.readme}: no <!-- study:{name} begin --> / <!-- study:{name} end --> markers"
            )
        print(f"updated {args.readme}")
    print(f"wrote {out / 'PAIRED.md'}, {out / 'paired.json'}" + (f" and {fig}" if fig else ""))
    return 0

"""``pe-interp report DIR``: write ``report.html`` for one run directory, or for a sweep or
reproduce directory (with ``summary.md`` and ``summary.json``). It only reads what the probes
stored, so it can be rerun at any time."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write report.html for a run, a sweep or a reproduction",
        description="Write DIR/report.html: for a run directory (pe-interp train, then ablate / "
        "patch / decompose), or for a sweep, reproduce or demo directory (also summary.md and "
        "summary.json); for a survey's findings (pe-interp survey --out DIR), DIR/SURVEY.md.",
    )
    p.add_argument("dir", metavar="RUN_OR_SWEEP_DIR")
    p.add_argument("--title", default=None, help="the report's title")
    p.add_argument(
        "--link-with",
        nargs="+",
        default=None,
        metavar="NAME=SWEEP_DIR",
        help="add other sweeps' models (e.g. mid=runs/sweeps/deposit-mid) to the length-generalisation, "
        "concentration and link tables of a sweep's report",
    )
    p.set_defaults(run=run)


def link_dirs(values: list[str] | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for value in values or []:
        name, sep, where = value.partition("=")
        if not sep or not name or not where:
            raise ValueError(f"--link-with: expected NAME=SWEEP_DIR, got {value!r}")
        if not (Path(where) / "grid.json").is_file():
            raise ValueError(
                f"--link-with {value}: {where} is not a sweep directory (no grid.json)"
            )
        out[name] = Path(where)
    return out


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.show_dirs import is_survey_dir, model_report_refusal
    from pe_interp.runs.checkpoint import split_step
    from pe_interp.runs.gguf_file import is_gguf_file
    from pe_interp.runs.model_dirs import is_model_dir
    from pe_interp.util.io import read_json

    path, step = split_step(args.dir)
    linked = link_dirs(args.link_with)
    if step is not None and not (path / "config.json").is_file():
        raise ValueError(f"{args.dir}: RUN@STEP needs a run directory (config.json) before the '@'")
    if (path / "grid.json").is_file():
        from pe_interp.report import write_report

        grid = read_json(path / "grid.json")
        base = grid.get("base", {}) if isinstance(grid, dict) else {}
        out = write_report(
            path, preset=str(base.get("preset", "quick")), title=args.title, link_with=linked
        )
        print(f"wrote {path / 'summary.md'}, {path / 'summary.json'} and {out}")
    elif linked:
        raise ValueError("--link-with: only a sweep's report links other sweeps' models")
    elif step is None and is_survey_dir(path):  # a survey's findings: SURVEY.md, rebuilt
        from pe_interp.report.survey import write_survey_report

        print("wrote " + ", ".join(str(p) for p in write_survey_report(path)))
    elif is_model_dir(path) or (is_gguf_file(path) and path.is_file()):
        raise ValueError(model_report_refusal(path))
    elif (path / "config.json").is_file():
        from pe_interp.report.run import write_run_report
        from pe_interp.runs.checkpoint import load_run

        load_run(
            path, step=step
        )  # a one-line error for a broken run directory or a step it did not keep
        print(f"wrote {write_run_report(path, step)}")
    elif not path.exists():
        raise ValueError(f"{path}: no such directory")
    else:
        raise ValueError(
            f"{path}: neither a run directory (config.json) nor a sweep directory (grid.json), "
            "nor a survey's findings (pe-interp survey --out DIR)"
        )
    return 0

"""``pe-interp sweep GRID_FILE`` and ``pe-interp sweep-report SWEEP_DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of runs (local process pool or Ray)",
        description="Run every unfinished cell of a grid file; finished cells are skipped.",
    )
    p.add_argument("grid", help="YAML or TOML grid file")
    p.add_argument("--out", default=None, help="sweep directory (default runs/sweeps/<grid name>)")
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local: processes (default: cores / cpus per cell)",
    )
    p.add_argument(
        "--address", default=None, help="ray: cluster address (default: start a local instance)"
    )
    p.add_argument(
        "--max-retries", type=int, default=3, help="ray: retries of a cell whose worker died"
    )
    p.add_argument("--dry-run", action="store_true", help="validate the grid and list its cells")
    p.add_argument(
        "--max-cells", type=int, default=None, help="refuse larger grids (default 10,000)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run_sweep_cmd)

    r = sub.add_parser(
        "sweep-report",
        help="aggregate a sweep into one table",
        description="Aggregate every finished cell: accuracy mean ± std over seeds per axis setting, and deposit flags.",
    )
    r.add_argument("sweep_dir")
    r.add_argument(
        "--by", nargs="*", default=None, help="axes to group by (default: the grid's axes)"
    )
    r.set_defaults(run=run_report_cmd)


def run_sweep_cmd(args: argparse.Namespace) -> int:
    from pe_interp.commands.destinations import out_dir_arg
    from pe_interp.commands.options import at_least, positive_n
    from pe_interp.sweep import load_grid, run_sweep
    from pe_interp.sweep.executors import sweep_lock
    from pe_interp.sweep.grid import MAX_CELLS
    from pe_interp.sweep.owner import claim

    positive_n(args.max_cells, "--max-cells")
    positive_n(args.workers, "--workers")
    at_least(args.max_retries, 0, "--max-retries")
    out_dir_arg(args.out)
    grid = load_grid(args.grid, max_cells=args.max_cells or MAX_CELLS)
    cells = grid.cells()
    if args.dry_run:
        for c in cells:
            print(c.id)
        print(f"{len(cells)} cells")
        return 0
    if args.backend == "local":  # every cell would train, then fail on it: say so before starting
        check_local_devices(cells, args.grid)
    out = Path(args.out or Path("runs") / "sweeps" / grid.name)
    with sweep_lock(out):  # a second sweep, or another grid: one line before anything else is said
        claim(out, grid)
        print(
            f"{grid.name}: {len(cells)} cells; probes: " + (", ".join(grid.probes) or "none"),
            file=sys.stderr,
            flush=True,
        )
        summary = run_sweep(
            grid,
            out,
            backend=args.backend,
            workers=args.workers,
            address=args.address,
            max_retries=args.max_retries,
            progress=not args.no_progress,
        )
    print(
        json.dumps(
            {
                "sweep_dir": str(out),
                "done": len(summary.done),
                "skipped": len(summary.skipped),
                "failed": summary.failed,
                "recomputed": summary.recomputed,
            }
        )
    )
    write_report(out, grid.varying)
    return 1 if summary.failed else 0


def check_local_devices(cells, source) -> None:
    """A one-line error if a cell asks for a device this machine lacks (a grid for a GPU can be
    validated with --dry-run anywhere, and run with --backend ray on a cluster that has it)."""
    from pe_interp.config.model import check_device

    for device in sorted({str(c.kwargs["device"]) for c in cells if c.kwargs.get("device")}):
        try:
            check_device(device)
        except ValueError as err:
            raise ValueError(
                f"{source}: {err} (the grid's cells ask for it; --dry-run validates it anyway)"
            ) from None


def write_report(sweep_dir: Path, axes: list[str]) -> str:
    from pe_interp.report.study import is_study, study_table
    from pe_interp.sweep import aggregate, collect, format_table
    from pe_interp.util.io import atomic_write_json, atomic_write_text

    results, errors = collect(sweep_dir)
    rows = aggregate(results, axes)
    table = format_table(rows)
    if errors:
        table += "\nFailed cells:\n" + "".join(f"- {e['id']}: {e['error']}\n" for e in errors)
    atomic_write_json(sweep_dir / "report.json", {"axes": axes, "rows": rows, "errors": errors})
    atomic_write_text(sweep_dir / "report.md", table)
    if is_study(sweep_dir):  # one-factor variants: the deposit study by condition, too
        t = study_table(sweep_dir)
        atomic_write_json(sweep_dir / "study.json", t.to_dict())
        study = f"\n## {t.title}\n\n{t.markdown()}\n{t.notes[0]}\n"
        atomic_write_text(sweep_dir / "study.md", study)
        table += study
    return table


def run_report_cmd(args: argparse.Namespace) -> int:
    from pe_interp.util.io import read_json

    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir():
        raise ValueError(
            f"{sweep_dir}: no such directory"
            if not sweep_dir.exists()
            else f"{sweep_dir}: not a directory"
        )
    grid_file = sweep_dir / "grid.json"
    if not grid_file.is_file():
        raise ValueError(f"{grid_file}: not a sweep directory (no grid.json)")
    grid = read_json(grid_file)
    axes = args.by if args.by is not None else grid.get("varying", list(grid["axes"]))
    print(write_report(sweep_dir, axes), end="")
    return 0

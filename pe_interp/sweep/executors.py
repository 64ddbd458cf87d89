"""Running a grid's cells: the executors that run many, in local processes or on Ray (see
:mod:`pe_interp.sweep`); one cell (train, probes, ``result.json``) is :mod:`pe_interp.sweep.cell`."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pe_interp.runs.checkpoint import WEIGHTS, weights_provenance
from pe_interp.sweep.aggregate import collect
from pe_interp.sweep.cell import CHAOS_ENV, missing_probes, run_cell, safe_run_cell
from pe_interp.sweep.findings import has_finding, write_finding
from pe_interp.sweep.grid import ERROR, RESULT, Cell, Grid
from pe_interp.sweep.owner import GRID_FILE, claim, option_changes, probes_to_rerun, record_options
from pe_interp.sweep.pinning import cell_threads
from pe_interp.sweep.probing import PROBES, SWEEP_PROBES
from pe_interp.sweep.progress import Progress
from pe_interp.sweep.workers import stop_workers as _stop_workers
from pe_interp.sweep.workers import worker_init as _worker_init
from pe_interp.util import interrupts
from pe_interp.util.io import atomic_write_json, dir_lock, read_json

__all__ = ["CHAOS_ENV", "SweepSummary", "missing_probes", "run_cell", "run_sweep", "sweep_lock"]


def sweep_lock(sweep_dir: str | Path):
    """The sweep directory's lock (:func:`pe_interp.util.io.dir_lock`), re-entrant: a command may take
    it before :func:`run_sweep` does, to refuse before it prints anything."""
    return dir_lock(
        sweep_dir,
        "sweep directory",
        hint="wait for it to end (two sweeps into one directory would "
        "train every cell twice), or use another --out",
    )


@dataclass(frozen=True)
class SweepSummary:
    done: list[str]
    skipped: list[str]
    failed: dict[str, str]
    # finished cells whose out-of-date probes ran again: cell id -> probes
    recomputed: dict[str, list[str]] = field(default_factory=dict)


def run_sweep(
    grid: Grid,
    sweep_dir: str | Path,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    max_retries: int = 3,
    progress: bool = True,
) -> SweepSummary:
    """Run every unfinished cell of ``grid`` into ``sweep_dir`` (resumable).

    The directory is locked while the sweep runs (a second sweep into it gets a one-line
    error) and belongs to one grid (:func:`~pe_interp.sweep.owner.claim`). A finished cell runs
    again exactly its out-of-date probes, and says which. SIGINT and SIGTERM stop the workers
    (each running cell saves a checkpoint) and raise
    :class:`~pe_interp.util.interrupts.Interrupted`, whose message says how to resume."""
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    sweep_dir = Path(sweep_dir)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ValueError(
            f"{sweep_dir}: exists and is not a directory; choose another sweep directory"
        )
    with interrupts.sigterm_raises(), sweep_lock(sweep_dir):
        try:
            return _sweep(grid, sweep_dir, backend, workers, address, max_retries, progress)
        except KeyboardInterrupt as err:
            signum = getattr(err, "signum", signal.SIGINT)
            n = sum(1 for c in grid.cells() if (sweep_dir / "cells" / c.id / RESULT).is_file())
            raise interrupts.Interrupted(
                f"stopped by {interrupts.signal_name(signum)}: {n} of {len(grid.cells())} cells finished, the running "
                f"ones saved their checkpoints in {sweep_dir}; rerun the same command to resume",
                signum,
            ) from None


def _sweep(
    grid: Grid,
    sweep_dir: Path,
    backend: str,
    workers: int | None,
    address: str | None,
    max_retries: int,
    progress: bool,
) -> SweepSummary:
    stored = claim(sweep_dir, grid)
    cells = grid.cells()
    finished = [c for c in cells if (sweep_dir / "cells" / c.id / RESULT).is_file()]
    for c in finished:
        record_options(sweep_dir / "cells" / c.id, stored)
    atomic_write_json(sweep_dir / GRID_FILE, grid.to_dict())
    redo = _to_redo(grid, sweep_dir, finished)
    complete = {c.id for c in finished if c.id not in redo}
    exported = _export_findings(grid, [c for c in finished if c.id in complete], sweep_dir)
    # a cell whose finding is committed is finished on any machine, its run directory or not
    found = {
        c.id for c in cells if c.id not in complete and c.id not in redo and has_finding(grid, c)
    }
    skipped = [c.id for c in cells if c.id in complete | found]
    todo = [c for c in cells if c.id not in set(skipped)]
    cpus = os.cpu_count() or 1
    threads = cell_threads(grid.resources)  # on every backend: a cell's numbers depend on it
    if progress:
        print(
            f"{grid.name}: {len(cells)} cells, {len(skipped)} already finished"
            + (f" ({len(found)} of them by their findings in {grid.findings})" if found else "")
            + (f", {exported} finding(s) written" if exported else "")
            + f", {len(todo)} to run",
            file=sys.stderr,
        )
    if redo:  # said whatever --no-progress: results change
        _say_recomputed(grid, stored, redo)

    def record(outcome: dict[str, Any]) -> None:
        """A cell has ended: its finding, when the grid keeps them."""
        if "error" not in outcome and grid.findings is not None:
            cell = next(c for c in todo if c.id == outcome["id"])
            write_finding(grid, cell, outcome, sweep_dir / "cells" / cell.id / "run")

    if backend == "local":
        workers = workers or max(1, cpus // threads)
        outcomes = _run_local(
            todo,
            str(sweep_dir),
            grid.probes,
            workers,
            threads,
            progress,
            grid.probe_options,
            record,
        )
    else:
        outcomes = _run_ray(todo, str(sweep_dir), grid, address, max_retries, progress, record)
    failed = {o["id"]: o["error"] for o in outcomes if "error" in o}
    done = [o["id"] for o in outcomes if "error" not in o]
    _run_sweep_probes(grid, sweep_dir)
    return SweepSummary(
        done=done,
        skipped=skipped,
        failed=failed,
        recomputed={k: v for k, v in redo.items() if k in done},
    )


def _to_redo(grid: Grid, sweep_dir: Path, finished: list[Cell]) -> dict[str, list[str]]:
    """The finished cells whose probes must run again (other options or other weights): id -> probes."""
    redo = {}
    for c in finished:
        run_dir = sweep_dir / "cells" / c.id / "run"
        now = weights_provenance(run_dir) if (run_dir / WEIGHTS).is_file() else None
        if names := probes_to_rerun(
            read_json(sweep_dir / "cells" / c.id / RESULT), grid.probes, grid.probe_options, now
        ):
            redo[c.id] = names
    return redo


def _say_recomputed(grid: Grid, stored, redo: dict[str, list[str]]) -> None:
    why = option_changes(stored, grid)
    names = [n for n in PROBES if any(n in v for v in redo.values())]
    reasons = (
        "; ".join(why[n] for n in names if n in why) or "their results came from other weights"
    )
    print(
        f"{grid.name}: recomputing {', '.join(names)} in {len(redo)} finished cell(s) ({reasons})",
        file=sys.stderr,
    )


def _run_sweep_probes(grid: Grid, sweep_dir: Path) -> None:
    """The grid's probes that read every cell's results, once the cells have run."""
    sweep_probes = [SWEEP_PROBES[name] for name in grid.probes if name in SWEEP_PROBES]
    if sweep_probes:
        results, _ = collect(sweep_dir)
        for probe in sweep_probes:
            probe(sweep_dir, results)


def _export_findings(grid: Grid, cells: list[Cell], sweep_dir: Path) -> int:
    """Write the missing findings of finished cells (a sweep stopped between a cell's end and its
    finding, or run before the grid kept findings); returns how many were written."""
    if grid.findings is None:
        return 0
    written = 0
    for cell in cells:
        if not has_finding(grid, cell):
            write_finding(
                grid,
                cell,
                read_json(sweep_dir / "cells" / cell.id / RESULT),
                sweep_dir / "cells" / cell.id / "run",
            )
            written += 1
    return written


def _run_local(
    cells, sweep_dir, probes, workers, threads, progress, options=None, record=None
) -> list[dict[str, Any]]:
    bar = Progress(len(cells), workers, progress)
    outcomes = []

    def done(outcome: dict[str, Any]) -> None:
        outcomes.append(outcome)
        if record is not None:
            record(outcome)
        bar.update(outcome)

    if workers <= 1 or len(cells) <= 1:
        for cell in cells:
            done(safe_run_cell(cell, sweep_dir, probes, threads, options))
        return outcomes
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn")  # no forked torch thread pools
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
    )
    try:
        pending = {
            pool.submit(safe_run_cell, c, sweep_dir, probes, threads, options): c for c in cells
        }
        while pending:
            finished, _ = wait(
                pending, timeout=min(30.0, bar.heartbeat), return_when=FIRST_COMPLETED
            )
            for fut in finished:
                cell = pending.pop(fut)
                try:
                    done(fut.result())
                except (
                    BrokenProcessPool
                ):  # a worker died (SIGKILL, out of memory): every running cell is lost
                    done(_lost(cell, sweep_dir))
            bar.tick()
    except BaseException:  # Ctrl-C or SIGTERM here: stop the workers, each at a checkpoint
        _stop_workers(pool)
        raise
    pool.shutdown(wait=True)
    return outcomes


def _lost(cell: Cell, sweep_dir: str) -> dict[str, Any]:
    record = {
        "id": cell.id,
        "error": "its worker process died (killed, or out of memory); rerun the sweep to "
        "resume the cell from its last checkpoint",
    }
    atomic_write_json(Path(sweep_dir) / "cells" / cell.id / ERROR, record)
    return record


def _run_ray(
    cells, sweep_dir, grid: Grid, address, max_retries, progress, record=None
) -> list[dict[str, Any]]:
    try:  # an optional extra: the error says how to install it
        import ray
    except ImportError:
        raise ValueError("the ray backend needs Ray: pip install 'pe-interp[ray]'") from None
    started = False
    if not ray.is_initialized():
        env = {k: v for k, v in os.environ.items() if k.startswith("PE_INTERP_")}
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env} if env else None,
        )
        started = True
    try:
        cpus = float(grid.resources.get("cpus", 1))
        gpus = float(grid.resources.get("gpus", 0))
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=max_retries)(safe_run_cell)
        pending = [
            remote.remote(
                c, sweep_dir, grid.probes, cell_threads(grid.resources), grid.probe_options
            )
            for c in cells
        ]
        slots = max(1, int(ray.cluster_resources().get("CPU", 1) // max(cpus, 1e-9)))
        bar = Progress(len(cells), slots, progress)
        outcomes = []
        while pending:
            try:
                ready, pending = ray.wait(pending, num_returns=1)
            except BaseException:  # Ctrl-C or SIGTERM: cancel the cells (KeyboardInterrupt in them)
                for ref in pending:
                    ray.cancel(ref)
                raise
            for ref in ready:
                try:
                    outcomes.append(ray.get(ref))
                except Exception as err:  # noqa: BLE001 - worker lost beyond its retries
                    outcomes.append({"id": "?", "error": f"{type(err).__name__}: {err}"})
                if record is not None:
                    record(outcomes[-1])
                bar.update(outcomes[-1])
        return outcomes
    finally:
        if started:
            ray.shutdown()

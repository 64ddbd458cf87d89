"""Running a grid's cells: one cell (train, probes, ``result.json``), and the executors that run
many, in local processes or on Ray (see :mod:`pe_interp.sweep`)."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pe_interp import interrupts
from pe_interp.api import train
from pe_interp.checkpoint import WEIGHTS, WEIGHTS_KEY, load_run, weights_provenance
from pe_interp.hardware import machine
from pe_interp.io import atomic_write_json, dir_lock, read_json
from pe_interp.sweep.aggregate import collect
from pe_interp.sweep.findings import has_finding, write_finding
from pe_interp.sweep.grid import CELL, ERROR, PROBES_RUN, RESULT, Cell, Grid
from pe_interp.sweep.owner import (
    GRID_FILE,
    OPTIONS_RUN,
    claim,
    option_changes,
    probes_to_rerun,
    record_options,
)
from pe_interp.sweep.pinning import cell_route, cell_threads, pinned
from pe_interp.sweep.probing import CALLBACKS, PROBES, SWEEP_PROBES
from pe_interp.sweep.progress import Progress
from pe_interp.sweep.workers import WORKER
from pe_interp.sweep.workers import stop_workers as _stop_workers
from pe_interp.sweep.workers import worker_init as _worker_init

__all__ = ["CHAOS_ENV", "SweepSummary", "missing_probes", "run_cell", "run_sweep", "sweep_lock"]


# ---- one cell ---------------------------------------------------------------------------------
def missing_probes(result: dict[str, Any], probes: tuple[str, ...]) -> list[str]:
    """The per-cell probes of ``probes`` that a finished cell's result has not run yet (a cell
    finished before a probe was added to the sweep gets it on the next run)."""
    done = set(result.get(PROBES_RUN, [k for k in result if k in PROBES]))
    return [name for name in probes if name in PROBES and name not in done]


def _run_probes(
    run: Any,
    names: list[str],
    result: dict[str, Any],
    options: dict[str, dict[str, Any]],
    pins: dict[str, Any],
) -> None:
    seconds = result.setdefault("seconds", {})
    used = result.setdefault(OPTIONS_RUN, {})
    for name in names:
        t0 = time.time()
        result.pop(name, None)
        if (record := PROBES[name](run, **options.get(name, {}))) is not None:
            result[name] = record
        seconds[name] = round(time.time() - t0, 1)
        used[name] = dict(options.get(name, {}))
        for key, value in pins.items():  # what the probe computed with (pe_interp.sweep.pinning)
            result.setdefault(key, {})[name] = value
    result[PROBES_RUN] = [*[n for n in result.get(PROBES_RUN, []) if n not in names], *names]
    result[WEIGHTS_KEY] = run.provenance


# A cell's run directory is locked while the cell trains and probes (pe_interp.io.dir_lock); a
# worker of an earlier, killed sweep may hold it for the few seconds it takes to stop.
CELL_LOCK_WAIT = 60.0


def run_cell(
    cell: Cell,
    sweep_dir: str | Path,
    probes: tuple[str, ...] = (),
    threads: int = 1,
    options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train one cell (resuming its own checkpoint if any), run its probes, write result.json.

    A finished cell is not trained again; only its probes that are out of date run
    (:func:`~pe_interp.sweep.owner.probes_to_rerun`: new, with other options, or of other
    weights). ``options`` are the grid's ``probe_options`` (keyword arguments per probe). The
    result records the seconds spent training and in each probe, each probe's options, and the
    weights the probes saw.

    The cell runs on ``threads`` intra-op threads, whatever the calling process had (given back
    after), and one bf16 attention route (:mod:`pe_interp.sweep.pinning`): a sweep passes its
    grid's :func:`~pe_interp.sweep.pinning.cell_threads` on every backend. ``cell.json`` and the
    result record both."""
    options = options or {}
    cell_dir = Path(sweep_dir) / "cells" / cell.id
    run_dir = cell_dir / "run"
    with (
        dir_lock(run_dir, "run directory", timeout=CELL_LOCK_WAIT),
        pinned(threads, cell_route(cell_dir)) as pins,  # entered under the lock
    ):
        if (cell_dir / RESULT).is_file():
            result = read_json(cell_dir / RESULT)
            run = load_run(run_dir)
            redo = probes_to_rerun(result, probes, options, run.provenance)
            if redo:
                _run_probes(run, redo, result, options, pins)
                atomic_write_json(cell_dir / RESULT, result)
            return result
        atomic_write_json(
            cell_dir / CELL, {"id": cell.id, "params": cell.kwargs, "seed": cell.seed, **pins}
        )
        (cell_dir / ERROR).unlink(missing_ok=True)
        kwargs = cell.kwargs
        callbacks = [
            CALLBACKS[name](cell, **options.get(name, {})) for name in probes if name in CALLBACKS
        ]
        t0 = time.time()
        # resume the cell's own run if an earlier attempt started it (a killed worker), else start it
        resume = (run_dir / "config.json").is_file()
        train(
            seed=cell.seed,
            out=run_dir,
            resume=resume,
            progress=False,
            callbacks=callbacks,
            **kwargs,
        )
        seconds = {"train": round(time.time() - t0, 1)}  # this process's share, after any resume
        run = load_run(run_dir)
        final = run.metrics()[-1]
        result: dict[str, Any] = {
            "id": cell.id,
            "params": kwargs,
            "seed": cell.seed,
            "final": final,
            "seconds": seconds,
            "machine": machine(),
            **{key: {"train": value} for key, value in pins.items()},
        }
        _run_probes(run, [name for name in PROBES if name in probes], result, options, pins)
        atomic_write_json(cell_dir / RESULT, result)
        return result


CHAOS_ENV = "PE_INTERP_CHAOS_KILL_ONCE"


def _safe_run_cell(
    cell: Cell,
    sweep_dir: str,
    probes: tuple[str, ...],
    threads: int,
    options: dict | None = None,
) -> dict[str, Any]:
    """run_cell, turning an exception into an error.json record (so the sweep goes on).

    Fault injection for tests: when ``$PE_INTERP_CHAOS_KILL_ONCE`` names a file that does not
    exist yet, the first cell to get here creates it and kills its own process mid-cell, the way
    a lost worker dies.

    A worker process (:mod:`pe_interp.sweep.workers`) that a signal stopped in training exits
    once the cell's checkpoint is saved: its parent is stopping it, or is dead (an orphan that
    returned would wait for more work forever)."""
    marker = os.environ.get(CHAOS_ENV)
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os.kill(os.getpid(), 9)
    try:
        return run_cell(cell, sweep_dir, probes, threads, options)
    except interrupts.Interrupted as err:
        if WORKER["in_worker"]:
            os._exit(
                interrupts.exit_code(err.signum)
            )  # the checkpoint is saved; the lock goes with the process
        raise
    except Exception as err:  # noqa: BLE001 - recorded, reported, not swallowed
        record = {
            "id": cell.id,
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(),
        }
        atomic_write_json(Path(sweep_dir) / "cells" / cell.id / ERROR, record)
        return record


def sweep_lock(sweep_dir: str | Path):
    """The sweep directory's lock (:func:`pe_interp.io.dir_lock`), re-entrant: a command may take
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
    :class:`~pe_interp.interrupts.Interrupted`, whose message says how to resume."""
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
    redo = {}
    for c in finished:
        run_dir = sweep_dir / "cells" / c.id / "run"
        now = weights_provenance(run_dir) if (run_dir / WEIGHTS).is_file() else None
        if names := probes_to_rerun(
            read_json(sweep_dir / "cells" / c.id / RESULT), grid.probes, grid.probe_options, now
        ):
            redo[c.id] = names
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
        why = option_changes(stored, grid)
        names = [n for n in PROBES if any(n in v for v in redo.values())]
        reasons = (
            "; ".join(why[n] for n in names if n in why) or "their results came from other weights"
        )
        print(
            f"{grid.name}: recomputing {', '.join(names)} in {len(redo)} finished cell(s) ({reasons})",
            file=sys.stderr,
        )

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
    sweep_probes = [SWEEP_PROBES[name] for name in grid.probes if name in SWEEP_PROBES]
    if sweep_probes:
        results, _ = collect(sweep_dir)
        for probe in sweep_probes:
            probe(sweep_dir, results)
    return SweepSummary(
        done=done,
        skipped=skipped,
        failed=failed,
        recomputed={k: v for k, v in redo.items() if k in done},
    )


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
            done(_safe_run_cell(cell, sweep_dir, probes, threads, options))
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
            pool.submit(_safe_run_cell, c, sweep_dir, probes, threads, options): c for c in cells
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
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=max_retries)(_safe_run_cell)
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

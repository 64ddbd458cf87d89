"""Running one cell of a grid: train (or load) its run, run the probes it still lacks, write
``result.json``; in a worker, with its failure written as the cell's error instead of raised.

:func:`run_cell` holds the cell's run directory locked while it trains and probes;
:func:`safe_run_cell` is what an executor's worker calls (:mod:`pe_interp.sweep.executors`).
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

from pe_interp.api import train
from pe_interp.runs.checkpoint import WEIGHTS_KEY, load_run
from pe_interp.sweep.grid import CELL, ERROR, PROBES_RUN, RESULT, Cell
from pe_interp.sweep.owner import OPTIONS_RUN, probes_to_rerun
from pe_interp.sweep.pinning import cell_route, pinned
from pe_interp.sweep.probing import CALLBACKS, PROBES
from pe_interp.sweep.workers import WORKER
from pe_interp.util import interrupts
from pe_interp.util.hardware import machine
from pe_interp.util.io import atomic_write_json, dir_lock, read_json

__all__ = ["CELL_LOCK_WAIT", "CHAOS_ENV", "missing_probes", "run_cell"]


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


# A cell's run directory is locked while the cell trains and probes (pe_interp.util.io.dir_lock); a
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


def safe_run_cell(
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

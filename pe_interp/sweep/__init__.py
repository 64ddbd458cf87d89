"""Grids of runs: encodings × tasks × seeds × architecture switches, locally or on Ray.

A grid is a small YAML (or TOML) file::

    name: deposit-conditions
    base:                      # one run's settings (any pe_interp.train argument or field)
      preset: quick
      task: distance
      encoding: rope
    axes:                      # crossed; each value list is one axis
      encoding: [rope, sinusoidal+rope]
      kv_source: [residual, embed]
    variants:                  # optional: override sets, one condition each (not crossed
      - {}                     #   with each other, only with the axes)
      - {mask_padding: false}
    seeds: [0, 1, 2]
    probes: [ablation]         # per cell after training, or over the sweep (pe_interp.sweep.probing)

Each cell is a training run plus its probes, in its own directory ``SWEEP_DIR/cells/<id>/``. A cell
is finished when its ``result.json`` exists (written atomically, last); a finished cell is
skipped on a rerun, and a cell that raised leaves ``error.json`` with the traceback while the
others go on. Re-running a cell is idempotent (training is deterministic and resumes from its own
checkpoint), so a Ray retry after a killed worker yields exactly one result.

One idea per module: :mod:`~pe_interp.sweep.grid` (cells from a grid file),
:mod:`~pe_interp.sweep.probing` (what is measured per cell and over the sweep),
:mod:`~pe_interp.sweep.executors` (running cells locally or on Ray) and
:mod:`~pe_interp.sweep.aggregate` (reading results back).
"""

from pe_interp.sweep.aggregate import aggregate, collect, deposits_of, format_table
from pe_interp.sweep.executors import CHAOS_ENV, SweepSummary, run_cell, run_sweep
from pe_interp.sweep.grid import (
    CELL,
    ERROR,
    GRID_KEYS,
    RESULT,
    RUN_KEYS,
    Cell,
    Grid,
    load_grid,
    parse_grid,
)
from pe_interp.sweep.probing import CALLBACKS, PROBES, SWEEP_PROBES

__all__ = [
    "CALLBACKS",
    "CELL",
    "CHAOS_ENV",
    "ERROR",
    "GRID_KEYS",
    "PROBES",
    "RESULT",
    "RUN_KEYS",
    "SWEEP_PROBES",
    "Cell",
    "Grid",
    "SweepSummary",
    "aggregate",
    "collect",
    "deposits_of",
    "format_table",
    "load_grid",
    "parse_grid",
    "run_cell",
    "run_sweep",
]

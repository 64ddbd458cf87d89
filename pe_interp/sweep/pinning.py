"""What a cell computes with, pinned so that a cell is a function of its seed and config whatever
runs it (see :mod:`pe_interp.sweep.executors`).

Two settings change a cell's numbers without being part of its config, and both used to come from
the process that ran it:

- torch's intra-op thread count: a matmul or a reduction split over 2 threads rounds differently
  from one on 1 (a ``smoke`` cell's train loss at step 8: 1.8047619 on 1 thread, 1.8047548 on 2, in
  bf16; 1.80470030 and 1.80470029 in fp32). A local worker starts with one thread per core, a Ray
  worker with ``OMP_NUM_THREADS`` = its task's CPUs. Every backend now sets it to
  :func:`cell_threads` of the grid (``resources.cpus``, default 1) for the cell's training and
  probes, and gives the caller's setting back after. ``torch.set_num_threads`` overrides
  ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` (measured: the same losses with either set to 1 or
  4). The inter-op pool is left as it is: eager CPU ops do not use it, and torch allows setting it
  only once per process, before any parallel work.
- the attention route under CPU bf16 autocast (:mod:`pe_interp.models.hooked.attn_routes`): chosen by timing
  each route in the process, once, then kept for the process's later cells. Timings depend on the
  load, so the same grid chose ``sdpa`` for a cell locally and ``sdpa32`` on Ray and gave other
  losses. A cell now runs one fixed route, :data:`CELL_ATTN_ROUTE` (or ``$PE_INTERP_ATTN_ROUTE``),
  recorded in its ``cell.json``; a cell resumed from a checkpoint of a run that measured its
  routes (one started before routes were pinned) keeps those (the Trainer pins them on resume).
  fp32 attention and CUDA do not take routes: there the route changes nothing. Since issue 54
  every process runs :data:`~pe_interp.models.hooked.attn_routes.DEFAULT_ROUTE` (the same route) unless told
  otherwise, so a cell's numbers equal those of ``pe-interp train`` with its settings and threads.

A cell's ``result.json`` records both per stage, like its ``seconds``: ``threads`` and
``attn_route``, ``{"train": ..., <probe>: ...}``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from pe_interp.models.hooked import attn_routes
from pe_interp.sweep.grid import CELL, RESULT
from pe_interp.util.io import read_json

__all__ = ["CELL_ATTN_ROUTE", "cell_route", "cell_threads", "pinned"]

# SDPA on fp32 copies of the bf16 inputs: the route the chooser took for training on the native-bf16
# Xeon at the paper's size (benchmarks/RESULTS.md) and at the smoke size here, and the most exact.
CELL_ATTN_ROUTE = attn_routes.DEFAULT_ROUTE


def cell_threads(resources: Mapping[str, Any]) -> int:
    """The intra-op thread count of a cell of a grid with ``resources``: its whole CPUs, at least 1
    (never the machine's cores or a worker's default)."""
    return max(1, int(resources.get("cpus", 1)))


def cell_route(cell_dir: Path) -> str | None:
    """The attention route a cell runs with: ``$PE_INTERP_ATTN_ROUTE``, else the one its
    ``cell.json`` recorded when it started, else :data:`CELL_ATTN_ROUTE`. None for a cell whose
    training resumes a checkpoint made before routes were pinned (the Trainer pins its measured
    routes, so that it continues exactly as it began)."""
    forced = os.environ.get(attn_routes.OVERRIDE_ENV)
    if forced:
        return forced
    if (cell_dir / CELL).is_file():
        recorded = read_json(cell_dir / CELL).get("attn_route")
        if recorded is not None:
            return recorded
    if not (cell_dir / RESULT).is_file() and (cell_dir / "run" / "config.json").is_file():
        return None  # training resumes a run that began without a pinned route
    return CELL_ATTN_ROUTE


@contextlib.contextmanager
def pinned(threads: int, route: str | None) -> Iterator[dict[str, Any]]:
    """Run the block with ``threads`` intra-op threads and every bf16 CPU attention on ``route``
    (None: the process's measured routes), restoring the caller's thread count after. Yields the
    record, ``{"threads": threads, "attn_route": route}``."""
    if int(threads) != threads or threads < 1:
        raise ValueError(f"a cell's thread count must be a whole number >= 1, got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        with attn_routes.force(route) if route is not None else contextlib.nullcontext():
            yield {"threads": int(threads), "attn_route": route}
    finally:
        torch.set_num_threads(before)

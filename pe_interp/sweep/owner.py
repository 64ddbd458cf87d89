"""Which grid a sweep directory belongs to, and which probes of a finished cell are out of date.

``SWEEP_DIR/grid.json`` is the owner record: the grid that first ran there. A later run into the
same directory must be the same grid (:data:`IDENTITY`: its name, base settings, axes, variants
and seeds), else it is refused with one line naming what differs, so that a report never pools
the cells of two grids. Within the same grid, the probes may change: a finished cell records
the options each probe ran with (``result.json``, :data:`OPTIONS_RUN`) and the weights the
probes saw (``"weights"``), and :func:`probes_to_rerun` says exactly which of its probes to run
again: those added, those whose options changed, those that depend on one of these, and all of
them when the cell's weights are not the ones its results came from. Probes that record while a
cell trains (:data:`~pe_interp.sweep.probing.CALLBACKS`) cannot be recomputed without training
again: changing them over trained cells is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pe_interp.runs.checkpoint import WEIGHTS_KEY
from pe_interp.sweep.grid import PROBES_RUN, RESULT, Grid
from pe_interp.sweep.probing import CALLBACKS, PROBES
from pe_interp.util.io import atomic_write_json, read_json

__all__ = [
    "DEPENDS",
    "GRID_FILE",
    "IDENTITY",
    "OPTIONS_RUN",
    "claim",
    "option_changes",
    "probes_to_rerun",
    "record_options",
]

GRID_FILE = "grid.json"
IDENTITY = ("name", "base", "axes", "variants", "seeds")
OPTIONS_RUN = "probe_options_run"  # result.json: the options each per-cell probe ran with
# Probes that read another probe's output (attention and decomposition pick their head from the
# ablation): recomputing the first recomputes them.
DEPENDS = {"attention": ("ablation",), "decomposition": ("ablation",)}


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x, sort_keys=True, default=str))


def _identity(record: dict[str, Any]) -> dict[str, Any]:
    defaults = {"base": {}, "axes": {}, "variants": [{}], "seeds": [0]}
    return {k: _plain(record.get(k, defaults.get(k))) for k in IDENTITY}


def _differs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    for key in IDENTITY:
        a, b = old[key], new[key]
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"{key}.{k}: {json.dumps(a.get(k))[:50]} -> {json.dumps(b.get(k))[:50]}"
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)
            ]
        else:
            out.append(f"{key}: {json.dumps(a)[:50]} -> {json.dumps(b)[:50]}")
    return out


def option_changes(old: dict[str, Any] | None, grid: Grid) -> dict[str, str]:
    """Per probe of ``grid`` whose options (or presence) differ from the stored record's: why."""
    old = old or {}
    before, after = _plain(old.get("probe_options") or {}), _plain(grid.probe_options)
    had = set(old.get("probes") or [])
    out = {}
    for name in grid.probes:
        if name not in had:
            out[name] = f"{name} added to probes"
        elif before.get(name, {}) != after.get(name, {}):
            out[name] = (
                f"probe_options.{name} {json.dumps(before.get(name, {}))} -> {json.dumps(after.get(name, {}))}"
            )
    return out


def claim(sweep_dir: Path, grid: Grid) -> dict[str, Any] | None:
    """Check that ``sweep_dir`` is new or belongs to ``grid`` (call it under the sweep's lock);
    returns the stored record (None for a new directory). A one-line ValueError otherwise."""
    path = sweep_dir / GRID_FILE
    if not path.is_file():
        if (sweep_dir / "config.json").is_file():
            raise ValueError(
                f"{sweep_dir}: a run directory (config.json), not a sweep directory; use another --out"
            )
        return None
    try:
        stored = read_json(path)
    except ValueError as err:
        raise ValueError(
            f"{err}; this sweep directory's owner record is unreadable: restore it or use another --out"
        ) from None
    if not isinstance(stored, dict):
        raise ValueError(f"{path}: not a grid record (a JSON object expected); use another --out")
    diff = _differs(_identity(stored), _identity(grid.to_dict()))
    if diff:
        shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise ValueError(
            f"{sweep_dir} belongs to grid {stored.get('name')!r} ({GRID_FILE}), and this grid differs "
            f"({shown}): use another --out, or the grid that made it"
        )
    trained = [d for d in (sweep_dir / "cells").glob("*/run") if (d / "config.json").is_file()]
    for name, why in option_changes(stored, grid).items():
        if name in CALLBACKS and trained:
            raise ValueError(
                f"{sweep_dir}: {why}, but {name} records while a cell trains and {len(trained)} cell(s) "
                "have trained; use another --out (or the previous options)"
            )
    return stored


def record_options(cell_dir: Path, stored: dict[str, Any] | None) -> None:
    """Give a ``result.json`` written before cells recorded their probes' options the options
    its grid record claims (the best knowledge there is)."""
    path = cell_dir / RESULT
    result = read_json(path)
    if OPTIONS_RUN in result:
        return
    options = (stored or {}).get("probe_options") or {}
    ran = result.get(PROBES_RUN, [k for k in result if k in PROBES])
    result[OPTIONS_RUN] = {name: options.get(name, {}) for name in ran}
    atomic_write_json(path, result)


def probes_to_rerun(
    result: dict[str, Any],
    probes: tuple[str, ...],
    options: dict[str, dict[str, Any]],
    weights: dict[str, Any] | None,
) -> list[str]:
    """The per-cell probes of ``probes`` to (re)run on a finished cell, in dependency order:
    not run yet, run with other options, depending on one of those, or every one when the
    cell's weights now (``weights``) are not those its result records."""
    wanted = [name for name in PROBES if name in probes]
    recorded = result.get(WEIGHTS_KEY)
    if (
        weights is not None
        and isinstance(recorded, dict)
        and recorded.get("sha256") != weights["sha256"]
    ):
        return wanted
    ran = set(result.get(PROBES_RUN, [k for k in result if k in PROBES]))
    used = result.get(OPTIONS_RUN) or {}
    redo = {
        n for n in wanted if n not in ran or _plain(used.get(n, {})) != _plain(options.get(n, {}))
    }
    redo |= {n for n in wanted if any(d in redo for d in DEPENDS.get(n, ()))}
    return [n for n in wanted if n in redo]

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
    probes: [ablation]         # run per cell after training (see PROBES)

Each cell is a training run plus its probes, in its own directory ``SWEEP_DIR/cells/<id>/``. A cell
is finished when its ``result.json`` exists (written atomically, last); a finished cell is
skipped on a rerun, and a cell that raised leaves ``error.json`` with the traceback while the
others go on. Re-running a cell is idempotent (training is deterministic and resumes from its own
checkpoint), so a Ray retry after a killed worker yields exactly one result.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from pe_interp.checkpoint import atomic_write_json

GRID_KEYS = {"name", "base", "axes", "variants", "seeds", "probes", "resources"}
RUN_KEYS = {"task", "encoding", "preset", "authors_quirks"}
RESULT, ERROR, CELL = "result.json", "error.json", "cell.json"


def _allowed_fields() -> set[str]:
    from pe_interp.config import ModelConfig
    from pe_interp.tasks import TASKS
    from pe_interp.training import TrainConfig

    fields = set(ModelConfig.__dataclass_fields__) | set(TrainConfig.__dataclass_fields__) | RUN_KEYS
    for cls in TASKS.values():
        fields |= {f.name for f in dataclasses.fields(cls)}
    return fields - {"seed", "n_ctx", "n_classes"}  # seeds are their own key; sizes follow the task


@dataclass(frozen=True)
class Cell:
    """One run of a grid: its settings and seed."""

    params: tuple[tuple[str, Any], ...]
    seed: int

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def id(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, dict):  # an encoding spec: name plus parameters
                v = "_".join([str(v.get("name", ""))] + [f"{k}{fmt(x)}" for k, x in sorted(v.items()) if k != "name"])
            elif isinstance(v, list | tuple):
                v = "-".join(fmt(x) for x in v)
            return re.sub(r"[^A-Za-z0-9.+-]", "_", str(v).lower())

        parts = [f"{k}-{fmt(v)}" for k, v in self.params]
        return "__".join(parts + [f"seed-{self.seed}"])


@dataclass(frozen=True)
class Grid:
    name: str
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    seeds: tuple[int, ...]
    probes: tuple[str, ...] = ()
    resources: dict[str, float] = field(default_factory=dict)
    variants: tuple[dict[str, Any], ...] = ({},)

    @property
    def varying(self) -> list[str]:
        """The settings that differ between cells (axes first, then variant keys)."""
        keys = list(self.axes)
        for v in self.variants:
            keys += [k for k in v if k not in keys]
        return keys

    def cells(self) -> list[Cell]:
        names = self.varying
        out = []
        for values in itertools.product(*self.axes.values()):
            for variant in self.variants:
                setting = {**self.base, **dict(zip(self.axes, values)), **variant}
                order = sorted(setting.items(), key=lambda kv: (kv[0] not in names, kv[0]))
                for seed in self.seeds:
                    out.append(Cell(tuple(order), seed))
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "seeds": list(self.seeds), "probes": list(self.probes), "variants": list(self.variants), "varying": self.varying,
        }


def parse_grid(data: dict[str, Any], source: str = "grid") -> Grid:
    """Validate a grid mapping; every mistake raises a ValueError naming the key and the file."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a grid must be a mapping with keys {sorted(GRID_KEYS)}")
    unknown = sorted(set(data) - GRID_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; allowed: {sorted(GRID_KEYS)}")
    allowed = _allowed_fields()
    base = data.get("base") or {}
    axes = data.get("axes") or {}
    variants = data.get("variants") or [{}]
    if not isinstance(base, dict) or not isinstance(axes, dict):
        raise ValueError(f"{source}: 'base' and 'axes' must be mappings")
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ValueError(f"{source}: 'variants' must be a list of mappings")
    sections = [("base", base), ("axes", axes)] + [(f"variants[{i}]", v) for i, v in enumerate(variants)]
    for section, mapping in sections:
        for key in mapping:
            if key not in allowed:
                close = sorted(allowed, key=lambda a: _distance(a, key))[:3]
                raise ValueError(f"{source}: {section}.{key} is not a setting; did you mean {', '.join(close)}?")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{source}: axes.{key} must be a non-empty list, got {values!r}")
    seeds = data.get("seeds", [0])
    if isinstance(seeds, int):
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ValueError(f"{source}: seeds must be a count or a non-empty list of integers >= 0, got {seeds!r}")
    probes = data.get("probes") or []
    for p in probes:
        if p not in PROBES and p not in CALLBACKS:
            raise ValueError(f"{source}: probes: unknown probe {p!r}; allowed: {sorted(PROBES) + sorted(CALLBACKS)}")
    grid = Grid(
        name=str(data.get("name", Path(source).stem)),
        base=dict(base),
        axes={k: list(v) for k, v in axes.items()},
        seeds=tuple(seeds),
        probes=tuple(probes),
        resources=dict(data.get("resources") or {}),
        variants=tuple(dict(v) for v in variants),
    )
    ids = [c.id for c in grid.cells()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: two cells have the same settings (a repeated axis value or variant)")
    # Build every cell's configs now, so a bad value fails before any training starts.
    from pe_interp.presets import build_run_configs

    for cell in grid.cells():
        try:
            build_run_configs(seed=cell.seed, **cell.kwargs)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{source}: cell {cell.id}: {err}") from None
    return grid


def _distance(a: str, b: str) -> int:
    """Levenshtein distance, for 'did you mean' hints."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: grid file not found")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as err:  # yaml.YAMLError / tomllib.TOMLDecodeError
        raise ValueError(f"{path}: cannot parse ({str(err).splitlines()[0]})") from None
    return parse_grid(data, str(path))


# ---- probes run per cell ----------------------------------------------------------------------
def _probe_ablation(run, n: int = 2000) -> dict[str, Any]:
    """Zero-ablation of every head on the held-out split, and deposit detection."""
    from probes import ablate_heads, find_deposits

    test = run.test_set(n)
    result = ablate_heads(run.model, test.tokens, test.labels, pad_mask=test.pad_mask, method="zero")
    report = find_deposits(result)
    atomic_write_json(run.run_dir / "ablation.json", result.to_dict(per_example=False))
    atomic_write_json(run.run_dir / "deposits.json", report.to_dict())
    return {"ablation": result.to_dict(per_example=False), "deposits": report.to_dict()}


def _rotary_task1(run) -> bool:
    return run.task.name == "distance" and run.model.cfg.encoding_kind in ("multiplicative", "hybrid")


def _probe_patching(run, n: int = 256) -> dict[str, Any] | None:
    """Head-output patching with distance counterfactuals (task-1 rotary models only)."""
    if not _rotary_task1(run):
        return None
    from probes import patch

    pairs = run.task.counterfactual_pairs(n, seed=run.train_cfg.seed + 7919)
    result = patch(
        run.model, pairs.clean.tokens, pairs.corrupt.tokens, site="z", pad_mask=pairs.clean.pad_mask,
        clean_labels=pairs.clean.labels, corrupt_labels=pairs.corrupt.labels,
    )
    record = result.to_dict()
    atomic_write_json(run.run_dir / "patching.json", record)
    return record


def _probe_positional(run, n: int = 128) -> dict[str, Any] | None:
    """Per-head positional scores (task-1 rotary models only)."""
    if not _rotary_task1(run):
        return None
    from probes import positional_scores

    test = run.test_set(n)
    record = positional_scores(run.model, test.tokens, pad_mask=test.pad_mask).to_dict()
    atomic_write_json(run.run_dir / "positional.json", record)
    return record


def _dynamics_callback(cell: Cell) -> Any:
    """Deposit dynamics of layer 0, recorded about 20 times over training."""
    from pe_interp.presets import build_run_configs
    from probes import DepositDynamics

    _, _, train_cfg = build_run_configs(seed=cell.seed, **cell.kwargs)
    return DepositDynamics(every=max(1, train_cfg.total_steps // 20), layers=(0,), n_probe=512)


# Post-hoc probes: fn(run) -> JSON-able record (None: not applicable to this run).
PROBES: dict[str, Callable[[Any], dict[str, Any] | None]] = {
    "ablation": _probe_ablation,
    "patching": _probe_patching,
    "positional": _probe_positional,
}
# Probes that watch training: fn(cell) -> Callback.
CALLBACKS: dict[str, Callable[[Cell], Any]] = {"dynamics": _dynamics_callback}


# ---- one cell ---------------------------------------------------------------------------------
def run_cell(cell: Cell, sweep_dir: str | Path, probes: tuple[str, ...] = (), threads: int | None = None) -> dict[str, Any]:
    """Train one cell (resuming its own checkpoint if any), run its probes, write result.json."""
    import torch

    from pe_interp.checkpoint import load_run
    from pe_interp.training import train

    if threads:
        torch.set_num_threads(threads)
    cell_dir = Path(sweep_dir) / "cells" / cell.id
    if (cell_dir / RESULT).is_file():
        return json.loads((cell_dir / RESULT).read_text())
    run_dir = cell_dir / "run"
    atomic_write_json(cell_dir / CELL, {"id": cell.id, "params": cell.kwargs, "seed": cell.seed})
    (cell_dir / ERROR).unlink(missing_ok=True)
    kwargs = cell.kwargs
    callbacks = [CALLBACKS[name](cell) for name in probes if name in CALLBACKS]
    train(seed=cell.seed, out=run_dir, resume=True, progress=False, callbacks=callbacks, **kwargs)
    run = load_run(run_dir)
    final = run.metrics()[-1]
    result: dict[str, Any] = {"id": cell.id, "params": kwargs, "seed": cell.seed, "final": final}
    for name in probes:
        if name in PROBES and (record := PROBES[name](run)) is not None:
            result[name] = record
    atomic_write_json(cell_dir / RESULT, result)
    return result


CHAOS_ENV = "PE_INTERP_CHAOS_KILL_ONCE"


def _safe_run_cell(cell: Cell, sweep_dir: str, probes: tuple[str, ...], threads: int | None) -> dict[str, Any]:
    """run_cell, turning an exception into an error.json record (so the sweep goes on).

    Fault injection for tests: when ``$PE_INTERP_CHAOS_KILL_ONCE`` names a file that does not
    exist yet, the first cell to get here creates it and kills its own process mid-cell, the way
    a lost worker dies.
    """
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
        return run_cell(cell, sweep_dir, probes, threads)
    except Exception as err:  # noqa: BLE001 - recorded, reported, not swallowed
        record = {"id": cell.id, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        atomic_write_json(Path(sweep_dir) / "cells" / cell.id / ERROR, record)
        return record


@dataclass(frozen=True)
class SweepSummary:
    done: list[str]
    skipped: list[str]
    failed: dict[str, str]


def run_sweep(
    grid: Grid,
    sweep_dir: str | Path,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    max_retries: int = 3,
    progress: bool = True,
) -> SweepSummary:
    """Run every unfinished cell of ``grid`` into ``sweep_dir`` (resumable)."""
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(sweep_dir / "grid.json", grid.to_dict())
    cells = grid.cells()
    skipped = [c.id for c in cells if (sweep_dir / "cells" / c.id / RESULT).is_file()]
    todo = [c for c in cells if c.id not in set(skipped)]
    cpus = os.cpu_count() or 1
    threads = int(grid.resources.get("cpus", 1)) or 1
    if backend == "local":
        outcomes = _run_local(todo, str(sweep_dir), grid.probes, workers or max(1, cpus // threads), threads, progress)
    else:
        outcomes = _run_ray(todo, str(sweep_dir), grid, address, max_retries, progress)
    failed = {o["id"]: o["error"] for o in outcomes if "error" in o}
    done = [o["id"] for o in outcomes if "error" not in o]
    return SweepSummary(done=done, skipped=skipped, failed=failed)


def _bar(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="cells", unit="cell", dynamic_ncols=True)


def _run_local(cells, sweep_dir, probes, workers, threads, progress) -> list[dict[str, Any]]:
    bar = _bar(len(cells), progress)
    outcomes = []
    if workers <= 1 or len(cells) <= 1:
        for cell in cells:
            outcomes.append(_safe_run_cell(cell, sweep_dir, probes, threads))
            if bar:
                bar.update(1)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = mp.get_context("spawn")  # no forked torch thread pools
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_safe_run_cell, c, sweep_dir, probes, threads) for c in cells]
            for fut in as_completed(futures):
                outcomes.append(fut.result())
                if bar:
                    bar.update(1)
    if bar:
        bar.close()
    return outcomes


def _run_ray(cells, sweep_dir, grid: Grid, address, max_retries, progress) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise ValueError("the ray backend needs Ray: pip install 'pe-interp[ray]'") from None
    started = False
    if not ray.is_initialized():
        env = {k: v for k, v in os.environ.items() if k.startswith("PE_INTERP_")}
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env} if env else None)
        started = True
    try:
        cpus = float(grid.resources.get("cpus", 1))
        gpus = float(grid.resources.get("gpus", 0))
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=max_retries)(_safe_run_cell)
        pending = [remote.remote(c, sweep_dir, grid.probes, max(1, int(cpus))) for c in cells]
        bar = _bar(len(cells), progress)
        outcomes = []
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    outcomes.append(ray.get(ref))
                except Exception as err:  # noqa: BLE001 - worker lost beyond its retries
                    outcomes.append({"id": "?", "error": f"{type(err).__name__}: {err}"})
                if bar:
                    bar.update(1)
        if bar:
            bar.close()
        return outcomes
    finally:
        if started:
            ray.shutdown()


# ---- aggregation ------------------------------------------------------------------------------
def collect(sweep_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(results, errors) of every cell in a sweep directory."""
    cells_dir = Path(sweep_dir) / "cells"
    results, errors = [], []
    for d in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        if (d / RESULT).is_file():
            results.append(json.loads((d / RESULT).read_text()))
        elif (d / ERROR).is_file():
            errors.append(json.loads((d / ERROR).read_text()))
    return results, errors


def _deposit_of(result: dict[str, Any]) -> tuple[bool, Any]:
    dep = result.get("ablation", {}).get("deposits")
    if not dep:
        return False, None
    layers = dep.get("layers", [])
    flagged = [layer for layer in layers if layer.get("is_deposit")]
    return bool(flagged), flagged[0] if flagged else (layers[0] if layers else None)


def aggregate(results: list[dict[str, Any]], axes: list[str]) -> list[dict[str, Any]]:
    """One row per setting of ``axes``: accuracy mean ± std over seeds, and deposit counts."""
    import statistics

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        key = tuple((a, r["params"].get(a, "(base)")) for a in axes)
        groups.setdefault(key, []).append(r)
    rows = []
    for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        accs = [m["final"]["test_acc"] for m in members]
        row: dict[str, Any] = dict(key)
        row["n_seeds"] = len(members)
        row["acc_mean"] = statistics.fmean(accs)
        row["acc_std"] = statistics.stdev(accs) if len(accs) > 1 else 0.0
        deps = [_deposit_of(m) for m in members]
        if any(m.get("ablation") for m in members):
            row["deposit_seeds"] = sum(flag for flag, _ in deps)
            l0 = [d for _, d in deps if d is not None and d.get("layer") == 0]
            if l0:
                row["l0_top_drop"] = statistics.fmean(d["top_drop"] for d in l0)
                row["l0_second_drop"] = statistics.fmean(d["second_drop"] for d in l0)
                row["l0_top_share"] = statistics.fmean(d["share"] for d in l0)
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`aggregate` rows."""
    if not rows:
        return "(no finished cells)\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    def fmt(row, c):
        if c == "acc_mean":
            return f"{100 * row['acc_mean']:.1f} ± {100 * row['acc_std']:.1f}"
        v = row.get(c, "")
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    cols = [c for c in cols if c != "acc_std"]
    head = "| " + " | ".join("acc % (mean ± std)" if c == "acc_mean" else c for c in cols) + " |"
    sep = "|" + "---|" * len(cols)
    body = ["| " + " | ".join(fmt(r, c) for c in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"

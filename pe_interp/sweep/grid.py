"""Grids: the cells of a sweep, parsed and validated from a YAML or TOML file (see
:mod:`pe_interp.sweep`)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
import yaml

from pe_interp.config import ModelConfig, TrainConfig
from pe_interp.presets import build_run_configs
from pe_interp.sweep.probing import CALLBACKS, PROBE_OPTIONS, PROBES, SWEEP_PROBES
from pe_interp.tasks import TASKS

__all__ = ["CELL", "ERROR", "GRID_KEYS", "PROBES_RUN", "RESULT", "RUN_KEYS", "Cell", "Grid", "load_grid", "parse_grid"]

GRID_KEYS = {"name", "base", "axes", "variants", "seeds", "probes", "probe_options", "resources"}
RUN_KEYS = {"task", "encoding", "preset", "authors_quirks"}
# A cell's directory, SWEEP_DIR/cells/<id>/: its settings, then its result or its error.
RESULT, ERROR, CELL = "result.json", "error.json", "cell.json"
PROBES_RUN = "probes_run"  # result.json: the per-cell probes that have run on the cell


def _allowed_fields() -> set[str]:
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
    probe_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def varying(self) -> list[str]:
        """The settings that differ between cells (axes first, then variant keys)."""
        keys = list(self.axes)
        for v in self.variants:
            keys += [k for k in v if k not in keys and k != "seeds"]
        return keys

    def cells(self) -> list[Cell]:
        """Every cell, in grid order; a variant's own ``seeds`` replace the grid's for it."""
        names = self.varying
        out = []
        for values in itertools.product(*self.axes.values()):
            for variant in self.variants:
                settings = {k: v for k, v in variant.items() if k != "seeds"}
                setting = {**self.base, **dict(zip(self.axes, values)), **settings}
                order = sorted(setting.items(), key=lambda kv: (kv[0] not in names, kv[0]))
                for seed in variant.get("seeds", self.seeds):
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
            if key == "seeds" and section.startswith("variants"):
                _check_seeds(mapping[key], f"{source}: {section}.seeds", allow_count=False)
                continue
            if key not in allowed:
                close = sorted(allowed, key=lambda a: _distance(a, key))[:3]
                raise ValueError(f"{source}: {section}.{key} is not a setting; did you mean {', '.join(close)}?")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{source}: axes.{key} must be a non-empty list, got {values!r}")
    seeds = _check_seeds(data.get("seeds", [0]), f"{source}: seeds", allow_count=True)
    probes = data.get("probes") or []
    known = sorted(PROBES) + sorted(CALLBACKS) + sorted(SWEEP_PROBES)
    for p in probes:
        if p not in known:
            raise ValueError(f"{source}: probes: unknown probe {p!r}; allowed: {known}")
    options = _check_probe_options(data.get("probe_options") or {}, source)
    grid = Grid(
        name=str(data.get("name", Path(source).stem)),
        base=dict(base),
        axes={k: list(v) for k, v in axes.items()},
        seeds=tuple(seeds),
        probes=tuple(probes),
        resources=dict(data.get("resources") or {}),
        variants=tuple(dict(v) for v in variants),
        probe_options=options,
    )
    ids = [c.id for c in grid.cells()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: two cells have the same settings (a repeated axis value or variant)")
    # Build every cell's configs now, so a bad value fails before any training starts.
    for cell in grid.cells():
        try:
            build_run_configs(seed=cell.seed, **cell.kwargs)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{source}: cell {cell.id}: {err}") from None
    return grid


def _check_seeds(seeds: Any, where: str, allow_count: bool) -> list[int]:
    if allow_count and isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > 0:
        return list(range(seeds))
    ok = isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    if not ok:
        what = "a count or a non-empty list" if allow_count else "a non-empty list"
        raise ValueError(f"{where} must be {what} of integers >= 0, got {seeds!r}")
    return list(seeds)


def _check_probe_options(options: Any, source: str) -> dict[str, dict[str, Any]]:
    """``probe_options: {probe: {option: value}}``, each option a keyword of that probe."""
    if not isinstance(options, dict):
        raise ValueError(f"{source}: probe_options must be a mapping of probe name to options")
    for probe, opts in options.items():
        if probe not in PROBE_OPTIONS:
            raise ValueError(f"{source}: probe_options.{probe}: not a probe with options; allowed: {sorted(PROBE_OPTIONS)}")
        if not isinstance(opts, dict):
            raise ValueError(f"{source}: probe_options.{probe} must be a mapping, got {opts!r}")
        bad = sorted(set(opts) - PROBE_OPTIONS[probe])
        if bad:
            raise ValueError(f"{source}: probe_options.{probe}: unknown option(s) {bad}; allowed: {sorted(PROBE_OPTIONS[probe])}")
    return {k: dict(v) for k, v in options.items()}


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
            data = yaml.safe_load(text)
    except Exception as err:  # yaml.YAMLError / tomllib.TOMLDecodeError
        raise ValueError(f"{path}: cannot parse ({str(err).splitlines()[0]})") from None
    return parse_grid(data, str(path))

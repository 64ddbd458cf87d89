"""Grids: the cells of a sweep, parsed and validated from a YAML or TOML file (see
:mod:`pe_interp.sweep`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
import yaml

from pe_interp.config.model import ModelConfig, TrainConfig, check_run_configs
from pe_interp.config.presets import build_run_configs
from pe_interp.sweep.grid_checks import (
    check_probe_options,
    check_resources,
    check_seeds,
    grid_distance,
)
from pe_interp.sweep.probing import CALLBACKS, PROBES, SWEEP_PROBES
from pe_interp.sweep.yaml12 import YAML12Loader, yaml_error
from pe_interp.tasks import TASKS

__all__ = [
    "CELL",
    "ERROR",
    "GRID_KEYS",
    "MAX_CELLS",
    "PROBES_RUN",
    "RESULT",
    "RUN_KEYS",
    "Cell",
    "Grid",
    "condition_name",
    "count_cells",
    "load_grid",
    "parse_grid",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
GRID_KEYS = {
    "name",
    "base",
    "axes",
    "variants",
    "seeds",
    "probes",
    "probe_options",
    "resources",
    "findings",
}
RUN_KEYS = {"task", "encoding", "preset", "authors_quirks"}
# A cell's directory, SWEEP_DIR/cells/<id>/: its settings, then its result or its error.
RESULT, ERROR, CELL = "result.json", "error.json", "cell.json"
PROBES_RUN = "probes_run"  # result.json: the per-cell probes that have run on the cell


def _allowed_fields() -> set[str]:
    fields = (
        set(ModelConfig.__dataclass_fields__) | set(TrainConfig.__dataclass_fields__) | RUN_KEYS
    )
    for cls in TASKS.values():
        fields |= {f.name for f in dataclasses.fields(cls)}
    return fields - {"seed", "n_ctx", "n_classes"}  # seeds are their own key; sizes follow the task


def condition_name(params: dict[str, Any], base: dict[str, Any]) -> str:
    """How a cell's settings differ from a grid's base: ``"base"``, or ``key=value, ...`` (sorted
    by key; a base key the cell lacks reads ``key=None``). The study's name of a condition."""
    diff = {k: v for k, v in sorted(params.items()) if base.get(k) != v}
    diff |= {k: None for k in base if k not in params}

    def fmt(v: Any) -> str:
        return json.dumps(v) if isinstance(v, dict | list) else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in diff.items()) or "base"


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
                v = "_".join(
                    [str(v.get("name", ""))]
                    + [f"{k}{fmt(x)}" for k, x in sorted(v.items()) if k != "name"]
                )
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
    # where each finished cell's summary goes (pe_interp.sweep.findings): a directory, relative
    # paths resolved against the grid file's directory; None: no summaries
    findings: str | None = None

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

    def condition(self, cell: Cell) -> str:
        """The cell's condition (:func:`condition_name` against this grid's base)."""
        return condition_name(cell.kwargs, self.base)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "seeds": list(self.seeds),
            "probes": list(self.probes),
            "variants": list(self.variants),
            "varying": self.varying,
        }


# A grid larger than this is refused before any cell is built (pass max_cells, or
# ``pe-interp sweep --max-cells``, to allow more): at minutes per cell it could not finish anyway,
# and a typo such as a long range pasted into an axis should not take minutes to reject.
MAX_CELLS = 10_000


def count_cells(data: dict[str, Any]) -> int:
    """How many cells a (checked) grid mapping has, without building them."""
    n_axes = math.prod(len(v) for v in (data.get("axes") or {}).values())
    seeds = data.get("seeds", [0])
    n_seeds = seeds if isinstance(seeds, int) and not isinstance(seeds, bool) else len(seeds)
    variants = data.get("variants") or [{}]
    return n_axes * sum(len(v["seeds"]) if "seeds" in v else n_seeds for v in variants)


def parse_grid(data: dict[str, Any], source: str = "grid", max_cells: int = MAX_CELLS) -> Grid:
    """Validate a grid mapping; every mistake raises a ValueError naming the key and the file."""
    base, axes, variants = _check_sections(data, source)
    _check_settings(base, axes, variants, source)
    seeds = check_seeds(data.get("seeds", [0]), f"{source}: seeds", allow_count=True)
    probes = _check_probes(data, source)
    options = check_probe_options(data.get("probe_options") or {}, source)
    findings = data.get("findings")
    if findings is not None and not (isinstance(findings, str) and findings.strip()):
        raise ValueError(f"{source}: 'findings' must be a directory path, got {findings!r}")
    resources = check_resources(data.get("resources"), source)
    n_cells = count_cells({**data, "seeds": seeds, "axes": axes, "variants": variants})
    if n_cells > max_cells:
        shape = " x ".join(f"{len(v)} {k}" for k, v in axes.items()) or "no axes"
        raise ValueError(
            f"{source}: the grid has {n_cells:,} cells ({shape}, {len(variants)} variant(s), with their seeds); "
            f"the limit is {max_cells:,}: split it into smaller grids or raise the limit (--max-cells)"
        )
    grid = Grid(
        name=str(data.get("name", Path(source).stem)),
        base=dict(base),
        axes={k: list(v) for k, v in axes.items()},
        seeds=tuple(seeds),
        probes=tuple(probes),
        resources=resources,
        variants=tuple(dict(v) for v in variants),
        probe_options=options,
        findings=findings,
    )
    _check_cells(grid, source)
    return grid


def _check_sections(data: Any, source: str) -> tuple[dict, dict, list[dict]]:
    """The grid's keys, name, and the shapes of ``base``, ``axes`` and ``variants`` (returned)."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a grid must be a mapping with keys {sorted(GRID_KEYS)}")
    unknown = sorted(set(data) - GRID_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; allowed: {sorted(GRID_KEYS)}")
    base = {} if data.get("base") is None else data["base"]
    axes = {} if data.get("axes") is None else data["axes"]
    variants = data.get("variants", [{}])
    if not isinstance(base, dict):
        raise ValueError(f"{source}: 'base' must be a mapping of settings, got {base!r:.60}")
    if not isinstance(axes, dict):
        raise ValueError(
            f"{source}: 'axes' must be a mapping of setting -> list of values, got {axes!r:.60}"
        )
    if (
        not isinstance(variants, list)
        or not variants
        or not all(isinstance(v, dict) for v in variants)
    ):
        raise ValueError(
            f"{source}: 'variants' must be a non-empty list of mappings (e.g. [{{}}, {{kv_source: embed}}]), "
            f"got {variants!r:.60}"
        )
    if "name" in data and not (isinstance(data["name"], str) and data["name"].strip()):
        raise ValueError(f"{source}: 'name' must be a non-empty string, got {data['name']!r}")
    if "name" in data and not _NAME.fullmatch(
        data["name"]
    ):  # the default sweep directory is runs/sweeps/<name>
        raise ValueError(
            f"{source}: 'name' must be letters, digits, '.', '_' or '-' (it names the sweep's "
            f"directory, runs/sweeps/<name>), got {data['name']!r}"
        )
    return base, axes, variants


def _check_settings(base: dict, axes: dict, variants: list[dict], source: str) -> None:
    """Every key of base, axes and the variants is a setting (a variant may set seeds); every
    axis is a non-empty list."""
    allowed = _allowed_fields()
    sections = [("base", base), ("axes", axes)] + [
        (f"variants[{i}]", v) for i, v in enumerate(variants)
    ]
    for section, mapping in sections:
        for key in mapping:
            if key == "seeds" and section.startswith("variants"):
                check_seeds(mapping[key], f"{source}: {section}.seeds", allow_count=False)
                continue
            if key not in allowed:
                close = sorted(allowed, key=lambda a: grid_distance(a, key))[:3]
                raise ValueError(
                    f"{source}: {section}.{key} is not a setting; did you mean {', '.join(close)}?"
                )
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{source}: axes.{key} must be a non-empty list, got {values!r}")


def _check_probes(data: dict[str, Any], source: str) -> list[str]:
    probes = [] if data.get("probes") is None else data["probes"]
    known = sorted(PROBES) + sorted(CALLBACKS) + sorted(SWEEP_PROBES)
    if not isinstance(probes, list):
        raise ValueError(
            f"{source}: probes must be a list of probe names (e.g. [ablation]), got {probes!r}; allowed: {known}"
        )
    for p in probes:
        if p not in known:
            raise ValueError(f"{source}: probes: unknown probe {p!r}; allowed: {known}")
    return probes


def _check_cells(grid: Grid, source: str) -> None:
    """No two cells alike, and each setting's configs build (once, not once per seed), so that a
    bad value fails before any training starts."""
    cells = grid.cells()
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"{source}: two cells have the same settings (a repeated axis value or variant)"
        )
    checked: set[str] = set()
    for cell in cells:
        key = json.dumps(cell.kwargs, sort_keys=True, default=str)
        if key in checked:
            continue
        checked.add(key)
        try:
            model_cfg, _, train_cfg = build_run_configs(seed=cell.seed, **cell.kwargs)
            check_run_configs(model_cfg, train_cfg)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{source}: cell {cell.id}: {err}") from None


def load_grid(path: str | Path, max_cells: int = MAX_CELLS) -> Grid:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: grid file not found")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (a grid is YAML or TOML)") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.load(text, Loader=YAML12Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: {yaml_error(err)}") from None
    except Exception as err:  # tomllib.TOMLDecodeError: its message names the line and column
        raise ValueError(f"{path}: invalid TOML: {str(err).splitlines()[0]}") from None
    grid = parse_grid(data, str(path), max_cells=max_cells)
    if (
        grid.findings is not None
    ):  # relative to the grid file, so that any working directory finds it
        grid = dataclasses.replace(grid, findings=str((path.parent / grid.findings).resolve()))
    return grid

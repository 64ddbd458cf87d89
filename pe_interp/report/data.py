"""Reading a reproduce directory: one :class:`CellInfo` per finished cell, with the probe outputs
turned into arrays (:class:`AblationView`) whatever optional keys a probe left out.

Everything here reads JSON written by the sweep runner and the probes; nothing is recomputed
except small statistics of the ablation grid (top head, share of the layer's drop, margins).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TASK_ORDER = ("distance", "count")
TASK_TITLES = {"distance": "Task 1 (distance)", "count": "Task 2 (count)"}
KIND_ORDER = ("none", "additive", "multiplicative", "hybrid")
# A drop is "large" from this many accuracy points on (the C7 threshold, fixed from the claim
# text "about 60 points"; see claims.py).
LARGE_DROP = 0.50
# A drop is "small" (negligible) up to this many accuracy points (the C8 tolerance, "within a few
# points of baseline").
SMALL_DROP = 0.05


def first(d: Any, *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` present (and not None) in mapping ``d``."""
    if not isinstance(d, dict):
        return default
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


def as_array(x: Any) -> np.ndarray | None:
    """A float array from nested lists with None for NaN (as the probes write them)."""
    if x is None:
        return None
    try:
        return np.array(x, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([[math.nan if v is None else v for v in row] for row in x], dtype=np.float64)


# ------------------------------------------------------------------------------------------------
# ablation grids
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerStats:
    layer: int
    top_head: int
    top_drop: float  # fraction (accuracy), positive = ablation hurt
    runner_up: float  # second-largest drop in the layer
    share: float  # top head's share of the layer's total positive drop
    ci: tuple[float, float] | None

    @property
    def margin(self) -> float:
        return self.top_drop - self.runner_up


@dataclass(frozen=True)
class AblationView:
    """The ``[n_layers, n_heads]`` drops of a single-head ablation sweep."""

    baseline: float
    drops: np.ndarray
    ci_low: np.ndarray | None
    ci_high: np.ndarray | None
    method: str
    metric: str
    n_examples: int

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AblationView | None:
        if not isinstance(d, dict) or d.get("head_sets"):
            return None
        drops = as_array(d.get("drops"))
        if drops is None or drops.ndim != 2:
            return None
        lo, hi = as_array(d.get("ci_low")), as_array(d.get("ci_high"))
        if lo is not None and lo.shape != drops.shape:
            lo = None
        if hi is not None and hi.shape != drops.shape:
            hi = None
        return cls(
            baseline=float(d.get("baseline", math.nan)),
            drops=drops,
            ci_low=lo,
            ci_high=hi,
            method=str(d.get("method", "?")),
            metric=str(d.get("metric", "?")),
            n_examples=int(d.get("n_examples", 0) or 0),
        )

    @property
    def n_layers(self) -> int:
        return self.drops.shape[0]

    @property
    def n_heads(self) -> int:
        return self.drops.shape[1]

    def ci(self, layer: int, head: int) -> tuple[float, float] | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        lo, hi = float(self.ci_low[layer, head]), float(self.ci_high[layer, head])
        return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)

    def layer_stats(self, layer: int) -> LayerStats:
        row = self.drops[layer]
        filled = np.nan_to_num(row, nan=-math.inf)
        order = np.argsort(-filled, kind="stable")
        top = int(order[0])
        runner = float(row[order[1]]) if len(row) > 1 and np.isfinite(filled[order[1]]) else 0.0
        pos = np.clip(np.nan_to_num(row, nan=0.0), 0.0, None)
        share = float(pos[top] / pos.sum()) if pos.sum() > 0 else 0.0
        return LayerStats(layer, top, float(row[top]), runner, share, self.ci(layer, top))

    def top(self) -> tuple[int, int, float]:
        """(layer, head, drop) of the most harmful single-head ablation in the model."""
        filled = np.nan_to_num(self.drops, nan=-math.inf)
        layer, head = np.unravel_index(int(np.argmax(filled)), filled.shape)
        return int(layer), int(head), float(self.drops[layer, head])

    def large_heads(self, threshold: float = LARGE_DROP) -> list[tuple[int, int]]:
        ls, hs = np.nonzero(np.nan_to_num(self.drops, nan=-math.inf) >= threshold)
        return [(int(a), int(b)) for a, b in zip(ls, hs)]

    def max_other(self, layer: int, head: int) -> float:
        """The largest drop among all heads except (layer, head)."""
        d = np.nan_to_num(self.drops.copy(), nan=-math.inf)
        d[layer, head] = -math.inf
        return float(d.max()) if np.isfinite(d.max()) else 0.0

    def margins(self) -> list[float]:
        return [self.layer_stats(layer).margin for layer in range(self.n_layers)]

    def dominance(self) -> Dominance:
        return dominance(self)


@dataclass(frozen=True)
class Dominance:
    """Whether one model (one seed) has a **single dominant head**: the one definition of a
    "deposit" / "single-head concentration" used by claims C7–C11, C14 and C16.

    A model has a single dominant head when exactly one head of the whole model has a drop
    ≥ :data:`LARGE_DROP` and every other head's drop is ≤ :data:`SMALL_DROP`.
    """

    layer: int  # the top head (largest drop in the whole model)
    head: int
    drop: float
    runner_up: float  # largest drop among all other heads of the model
    share: float  # top head's share of the model's total positive drop
    n_large: int  # heads with a drop >= LARGE_DROP
    baseline: float

    @property
    def top_large(self) -> bool:
        return self.drop >= LARGE_DROP

    @property
    def others_small(self) -> bool:
        return self.runner_up <= SMALL_DROP

    @property
    def single(self) -> bool:
        """Exactly one head with a large drop, every other head's drop small."""
        return self.top_large and self.n_large == 1 and self.others_small

    @property
    def room(self) -> bool:
        """Could this model show a large drop at all (baseline ≥ LARGE_DROP)?"""
        return self.baseline >= LARGE_DROP

    def text(self) -> str:
        return (f"top L{self.layer}H{self.head} drop {100 * self.drop:.1f} pts of baseline "
                f"{100 * self.baseline:.1f}%, runner-up {100 * self.runner_up:.1f} pts, top share "
                f"{100 * self.share:.0f}%, heads ≥ {100 * LARGE_DROP:.0f} pts: {self.n_large} → "
                + ("single dominant head" if self.single else "no single dominant head"))


def dominance(view: AblationView) -> Dominance:
    """The :class:`Dominance` statistics of one single-head ablation grid."""
    layer, head, drop = view.top()
    pos = np.clip(np.nan_to_num(view.drops, nan=0.0), 0.0, None)
    share = float(pos[layer, head] / pos.sum()) if pos.sum() > 0 else 0.0
    return Dominance(layer, head, drop, view.max_other(layer, head), share,
                     len(view.large_heads(LARGE_DROP)), view.baseline)


# ------------------------------------------------------------------------------------------------
# the deposit report written by probes.deposit (schema read defensively)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DepositFlag:
    found: bool | None  # None: no deposit report for this cell
    layer: int | None = None
    head: int | None = None
    heads: tuple[tuple[int, int], ...] = ()  # every flagged (layer, head)
    thresholds: dict[str, Any] = field(default_factory=dict)


def deposit_flag(report: Any) -> DepositFlag:
    """Read a ``DepositReport.to_dict()`` (``probes.deposit``): whether it flags a deposit, where.

    The current schema lists the flagged heads under ``deposits`` (``[[layer, head], ...]``);
    per-layer records marked ``is_deposit`` are accepted too.
    """
    if not isinstance(report, dict):
        return DepositFlag(None)
    thresholds = report.get("thresholds") if isinstance(report.get("thresholds"), dict) else {}
    heads: list[tuple[int, int]] = []
    if isinstance(report.get("deposits"), list):
        heads = [(int(x[0]), int(x[1])) for x in report["deposits"] if isinstance(x, list | tuple) and len(x) == 2]
    elif isinstance(report.get("layers"), list):
        for x in report["layers"]:
            if isinstance(x, dict) and first(x, "is_deposit", "flag") and "layer" in x:
                heads.append((int(x["layer"]), int(first(x, "top_head", "head", default=0))))
    else:
        return DepositFlag(None)
    heads.sort()
    if not heads:
        return DepositFlag(False, thresholds=thresholds)
    return DepositFlag(True, heads[0][0], heads[0][1], tuple(heads), thresholds)


# ------------------------------------------------------------------------------------------------
# cells
# ------------------------------------------------------------------------------------------------
@dataclass
class CellInfo:
    id: str
    label: str
    task: str
    seed: int
    kind: str
    params: dict[str, Any]
    final: dict[str, Any]
    run_dir: Path
    config: dict[str, Any] | None
    ablation: AblationView | None = None
    ablation_raw: dict[str, Any] | None = None
    deposits: dict[str, Any] | None = None
    patching: Any = None
    positional: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def test_acc(self) -> float:
        return float(self.final.get("test_acc", math.nan))

    @property
    def flag(self) -> DepositFlag:
        return deposit_flag(self.deposits)


def _kind(spec: Any, config: dict[str, Any] | None) -> str:
    from pe_interp.encodings import combined_kind, get_encoding_class, parse_encoding

    try:
        if config and "model" in config:
            from pe_interp.config import ModelConfig

            return ModelConfig.from_dict(config["model"]).encoding_kind
    except (ValueError, TypeError, KeyError):
        pass
    try:
        return combined_kind([get_encoding_class(s.name).kind for s in parse_encoding(spec)])
    except ValueError:
        return "none"


def _varying(results: list[dict[str, Any]]) -> list[str]:
    """Settings other than task/encoding/preset that differ between cells (grid variants)."""
    keys: set[str] = set()
    for r in results:
        keys |= set(r.get("params", {}))
    out = []
    for k in sorted(keys - {"task", "encoding", "preset"}):
        values = {json.dumps(r.get("params", {}).get(k), sort_keys=True) for r in results}
        if len(values) > 1:
            out.append(k)
    return out


def cell_label(params: dict[str, Any], varying: list[str]) -> str:
    from pe_interp.reproduce import encoding_label

    label = encoding_label(params.get("encoding"))
    extra = [f"{k}={params.get(k)}" for k in varying]
    return f"{label} [{', '.join(extra)}]" if extra else label


def load_cells(out_dir: str | Path) -> tuple[list[CellInfo], list[dict[str, Any]]]:
    """Every finished cell of a reproduce directory, and the error records of failed ones."""
    from pe_interp.sweep import collect

    out_dir = Path(out_dir)
    results, errors = collect(out_dir)
    varying = _varying(results)
    cells = []
    for r in results:
        params = dict(r.get("params", {}))
        cell_dir = out_dir / "cells" / str(r.get("id"))
        run_dir = cell_dir / "run"
        config = None
        if (run_dir / "config.json").is_file():
            try:
                config = json.loads((run_dir / "config.json").read_text())
            except json.JSONDecodeError:
                config = None
        abl = r.get("ablation") or {}
        abl_raw = abl.get("ablation") if isinstance(abl, dict) and "ablation" in abl else None
        if abl_raw is None and isinstance(abl, dict) and "drops" in abl:
            abl_raw = abl
        deposits = abl.get("deposits") if isinstance(abl, dict) else None
        positional = r.get("positional")
        if isinstance(positional, dict) and isinstance(positional.get("positional"), dict):
            positional = positional["positional"]
        patching = r.get("patching")
        if isinstance(patching, dict) and isinstance(patching.get("patching"), dict):
            patching = patching["patching"]
        cells.append(
            CellInfo(
                id=str(r.get("id")),
                label=cell_label(params, varying),
                task=str(params.get("task", "?")),
                seed=int(r.get("seed", 0)),
                kind=_kind(params.get("encoding"), config),
                params=params,
                final=dict(r.get("final") or {}),
                run_dir=run_dir,
                config=config,
                ablation=AblationView.from_dict(abl_raw),
                ablation_raw=abl_raw,
                deposits=deposits if isinstance(deposits, dict) else None,
                patching=patching,
                positional=positional,
            )
        )
    return cells, errors


def label_order(cells: list[CellInfo]) -> list[str]:
    """Encoding labels grouped by kind, each kind in the order of the reproduce table."""
    from pe_interp.reproduce import ENCODINGS

    known = [label for label, _ in ENCODINGS]
    labels = list(dict.fromkeys(c.label for c in cells))
    kind_of = {c.label: c.kind for c in cells}

    def key(label: str) -> tuple[int, int, str]:
        base = label.split(" [")[0]
        k = kind_of.get(label, "none")
        return (KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER),
                known.index(base) if base in known else len(known), label)

    return sorted(labels, key=key)


def task_order(cells: list[CellInfo]) -> list[str]:
    tasks = list(dict.fromkeys(c.task for c in cells))
    return sorted(tasks, key=lambda t: (TASK_ORDER.index(t) if t in TASK_ORDER else 99, t))


@dataclass(frozen=True)
class AccStat:
    mean: float
    std: float
    n: int
    values: tuple[float, ...]


def acc_stats(cells: list[CellInfo]) -> dict[tuple[str, str], AccStat]:
    """Held-out accuracy mean ± std (sample std; 0 for one seed) per (label, task)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for c in sorted(cells, key=lambda c: c.seed):
        if not math.isnan(c.test_acc):
            groups.setdefault((c.label, c.task), []).append(c.test_acc)
    return {
        k: AccStat(statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v), tuple(v))
        for k, v in groups.items()
    }


def load_dynamics_records(run_dir: Path) -> list[dict[str, Any]]:
    """The raw records of ``run_dir/deposit_dynamics.jsonl`` ([] when absent or unreadable)."""
    path = Path(run_dir) / "deposit_dynamics.jsonl"
    if not path.is_file():
        return []
    try:
        from probes.deposit import load_dynamics
    except ImportError:
        load_dynamics = None
    if load_dynamics is not None:
        try:
            return list(load_dynamics(path))
        except (json.JSONDecodeError, OSError):
            return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_dynamics(run_dir: Path) -> list[dict[str, Any]]:
    """Deposit dynamics of a run as ``[{"step": s, "drops": [L, H] array, "margin": [L] | None}]``.

    Reads ``deposit_dynamics.jsonl`` (one line per step and layer, as ``probes.deposit``'s
    ``DepositDynamics`` writes it: ``{"step", "layer", "drops", "margin", ...}``); a drops grid per
    line (``drops``) or a list of per-layer records (``layers``) is accepted too.
    """
    records = load_dynamics_records(run_dir)
    by_step: dict[int, dict[int, np.ndarray]] = {}
    margins: dict[int, dict[int, float]] = {}
    for rec in records:
        step = first(rec, "step")
        if step is None:
            continue
        step = int(step)
        grid = as_array(first(rec, "drops", "head_drops"))
        if grid is not None and grid.ndim == 2 and "layer" not in rec:
            for layer, row in enumerate(grid):
                by_step.setdefault(step, {})[layer] = row
        elif grid is not None and grid.ndim == 1 and "layer" in rec:
            by_step.setdefault(step, {})[int(rec["layer"])] = grid
        for lrec in rec.get("layers", []) if isinstance(rec.get("layers"), list) else []:
            d = as_array(first(lrec, "drops", "head_drops"))
            if d is not None and d.ndim == 1 and "layer" in lrec:
                by_step.setdefault(step, {})[int(lrec["layer"])] = d
            if first(lrec, "margin") is not None and "layer" in lrec:
                margins.setdefault(step, {})[int(lrec["layer"])] = float(lrec["margin"])
        m = first(rec, "margin", "margins")
        if isinstance(m, list):
            for layer, v in enumerate(m):
                if v is not None:
                    margins.setdefault(step, {})[layer] = float(v)
        elif m is not None and "layer" in rec:
            margins.setdefault(step, {})[int(rec["layer"])] = float(m)
    out = []
    for step in sorted(by_step):
        layers = by_step[step]
        n_layers = max(layers) + 1
        n_heads = max(len(v) for v in layers.values())
        grid = np.full((n_layers, n_heads), math.nan)
        for layer, row in layers.items():
            grid[layer, : len(row)] = row
        marg = margins.get(step)
        out.append({
            "step": step,
            "drops": grid,
            "margin": [marg.get(layer, math.nan) for layer in range(n_layers)] if marg else None,
        })
    return out

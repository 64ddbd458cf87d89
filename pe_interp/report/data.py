"""Reading a reproduce directory: one :class:`CellInfo` per finished cell, holding the probe
results as the probes' own types, loaded with their own ``from_dict`` / ``load``.

Nothing here computes anything about a model: it reads what the sweep stored
(:mod:`pe_interp.sweep.probing`) and takes statistics of the stored numbers (a layer's deposit
statistics are :func:`probes.deposit.layer_stats`, the one definition).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.config.model import ModelConfig
from pe_interp.encodings import combined_kind, get_encoding_class, parse_encoding
from pe_interp.report.labels import ENCODINGS, encoding_label
from pe_interp.sweep import collect
from pe_interp.sweep.probing import ATTENTION, DECOMPOSITION, AttentionRecord
from pe_interp.tasks import task_from_dict
from pe_interp.util.io import read_json
from probes import AblationResult, DepositReport, PatchResult, PositionalScores
from probes.deposit import LayerDeposit, dynamics_arrays, layer_stats, load_dynamics
from probes.deposit.dominance import GRANULE_TOL, LARGE_DROP, SMALL_DROP, Dominance, dominance

TASK_ORDER = ("distance", "count", "retrieve")
TASK_TITLES = {
    "distance": "Task 1 (distance)",
    "count": "Task 2 (count)",
    "retrieve": "Task 3 (retrieve)",
}
KIND_ORDER = ("none", "additive", "multiplicative", "hybrid")
# A claim's verdict (see claims.py).
REPRODUCED, NOT_REPRODUCED, NOT_MEASURED = "reproduced", "not reproduced", "not measured"
# A check that holds by construction (C17): it tests this code, not the paper.
SANITY_CHECK = "sanity check"
STATUSES = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURED, SANITY_CHECK)


# ------------------------------------------------------------------------------------------------
# statistics of a single-head ablation grid (an AblationResult with drops [n_layers, n_heads])
# ------------------------------------------------------------------------------------------------
def layer_deposit(a: AblationResult, layer: int) -> LayerDeposit | None:
    """One layer's deposit statistics (:func:`probes.deposit.layer_stats`)."""
    return layer_stats(
        a.drops[layer], a.ci_low[layer], a.ci_high[layer], layer=layer, require_separation=False
    )


def top(a: AblationResult) -> tuple[int, int, float]:
    """(layer, head, drop) of the most harmful single-head ablation in the model."""
    filled = np.nan_to_num(a.drops, nan=-math.inf)
    layer, head = np.unravel_index(int(np.argmax(filled)), filled.shape)
    return int(layer), int(head), float(a.drops[layer, head])


def ci_of(a: AblationResult, layer: int, head: int) -> tuple[float, float] | None:
    lo, hi = float(a.ci_low[layer, head]), float(a.ci_high[layer, head])
    return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def large_heads(a: AblationResult, threshold: float = LARGE_DROP) -> list[tuple[int, int]]:
    """Heads whose drop is at least ``threshold`` (at the evaluation set's granularity)."""
    ls, hs = np.nonzero(np.nan_to_num(a.drops, nan=-math.inf) >= threshold - GRANULE_TOL)
    return [(int(x), int(y)) for x, y in zip(ls, hs)]


def max_other(a: AblationResult, layer: int, head: int) -> float:
    """The largest drop among all heads except (layer, head)."""
    d = np.nan_to_num(a.drops.copy(), nan=-math.inf)
    d[layer, head] = -math.inf
    return float(d.max()) if np.isfinite(d.max()) else 0.0


def margins(a: AblationResult) -> list[float]:
    """Each layer's top-minus-runner-up drop (:attr:`probes.deposit.LayerDeposit.margin`)."""
    return [
        s.margin if (s := layer_deposit(a, layer)) is not None else math.nan
        for layer in range(a.n_layers)
    ]


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
    ablation: AblationResult | None = None  # a layers x heads grid
    deposits: DepositReport | None = None
    patching: PatchResult | None = None
    positional: PositionalScores | None = None
    attention: AttentionRecord | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    decomposition: dict[str, Any] | None = None  # the top head's logit terms (decomposition.json)

    @property
    def test_acc(self) -> float:
        return float(self.final.get("test_acc", math.nan))

    @property
    def found(self) -> bool | None:
        """Did ``probes.deposit`` flag a deposit (None: no deposit report for this cell)?"""
        return None if self.deposits is None else bool(self.deposits.deposits)

    @property
    def flagged(self) -> tuple[tuple[int, int], ...]:
        """Every flagged (layer, head), shallowest first."""
        return () if self.deposits is None else tuple(sorted(self.deposits.deposits))

    def dynamics(self) -> list[dict[str, Any]]:
        """The run's deposit-dynamics records ([] when it has none)."""
        path = self.run_dir / "deposit_dynamics.jsonl"
        return load_dynamics(path) if path.is_file() else []


def margin_over_training(cell: CellInfo, layer: int = 0) -> list[tuple[int, float]]:
    """(step, margin) of ``layer`` over training, from the deposit dynamics (finite values only)."""
    records = cell.dynamics()
    if not any(r.get("layer") == layer for r in records):
        return []
    a = dynamics_arrays(records, layer)
    return [(int(s), float(m)) for s, m in zip(a["steps"], a["margin"]) if not math.isnan(m)]


def _kind(spec: Any, config: dict[str, Any] | None) -> str:
    if config and "model" in config:
        return ModelConfig.from_dict(config["model"]).encoding_kind
    return combined_kind([get_encoding_class(s.name).kind for s in parse_encoding(spec)])


# A cell made from a committed checkpoint (``make demo``) names it under this key.
CHECKPOINT_KEY = "checkpoint"
# A checkpoint whose name starts so is a constructed control (grids/planted_quick.yaml): position
# planted in known heads, built to answer yes or no. It never counts toward a headline about
# trained models; the first screen and the demo's CLI set it apart as a control.
CONTROL_PREFIX = "planted-"


def is_control(cell: CellInfo) -> bool:
    """Whether the cell is a constructed control (:data:`CONTROL_PREFIX`), not a trained model."""
    return str(cell.params.get(CHECKPOINT_KEY, "")).startswith(CONTROL_PREFIX)


def _varying(results: list[dict[str, Any]]) -> list[str]:
    """Settings other than task/encoding/preset that differ between cells (grid variants)."""
    results = [r for r in results if CHECKPOINT_KEY not in r["params"]]
    keys: set[str] = set()
    for r in results:
        keys |= set(r["params"])
    out = []
    for k in sorted(keys - {"task", "encoding", "preset"}):
        values = {json.dumps(r["params"].get(k), sort_keys=True) for r in results}
        if len(values) > 1:
            out.append(k)
    return out


def cell_label(params: dict[str, Any], varying: list[str]) -> str:
    label = encoding_label(params.get("encoding"))
    if CHECKPOINT_KEY in params:
        return f"{label} [checkpoint {params[CHECKPOINT_KEY]}]"
    extra = [f"{k}={params.get(k)}" for k in varying]
    return f"{label} [{', '.join(extra)}]" if extra else label


def load_cell(r: dict[str, Any], out_dir: Path, varying: list[str]) -> CellInfo:
    """One finished cell from its ``result.json`` record and its run directory."""
    params = dict(r["params"])
    run_dir = out_dir / "cells" / str(r["id"]) / "run"
    config = read_json(run_dir / "config.json") if (run_dir / "config.json").is_file() else None
    abl = r.get("ablation")
    ablation = AblationResult.from_dict(abl["ablation"]) if abl else None
    attention = (
        AttentionRecord.load(run_dir / ATTENTION) if (run_dir / ATTENTION).is_file() else None
    )
    decomposition = (
        read_json(run_dir / DECOMPOSITION)
        if r.get("decomposition") and (run_dir / DECOMPOSITION).is_file()
        else None
    )
    return CellInfo(
        id=str(r["id"]),
        label=cell_label(params, varying),
        task=str(params["task"]),
        seed=int(r["seed"]),
        kind=_kind(params.get("encoding"), config),
        params=params,
        final=dict(r["final"]),
        run_dir=run_dir,
        config=config,
        ablation=ablation if ablation is not None and ablation.is_grid else None,
        deposits=DepositReport.from_dict(abl["deposits"]) if abl else None,
        patching=PatchResult.from_dict(r["patching"]) if r.get("patching") else None,
        positional=PositionalScores.from_dict(r["positional"]) if r.get("positional") else None,
        attention=attention,
        decomposition=decomposition,
    )


def load_run_cell(run_dir: str | Path, step: int | None = None) -> CellInfo:
    """One run directory (``pe-interp train``, then any of ``ablate``, ``patch``, ``decompose``)
    as a :class:`CellInfo`, from the files the probes wrote into it. A result computed from
    other weights than the run's (:func:`~pe_interp.runs.checkpoint.weights_status`) is left out and
    named in ``extra["stale"]`` (file -> why). ``step``: the results of that snapshot (``steps/S/``)."""
    from pe_interp.runs.checkpoint import STALE, STEPS_DIR, read_jsonl, weights_status

    run_dir = Path(run_dir)
    results = run_dir if step is None else run_dir / STEPS_DIR / str(step)
    config = read_json(run_dir / "config.json")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    task = config["task"]["name"]
    spec = config["model"]["encoding"]
    spec = (
        spec[0] if isinstance(spec, list) and len(spec) == 1 and set(spec[0]) == {"name"} else spec
    )
    spec = spec["name"] if isinstance(spec, dict) and set(spec) == {"name"} else spec
    if isinstance(spec, list) and all(isinstance(s, dict) and set(s) == {"name"} for s in spec):
        spec = "+".join(s["name"] for s in spec)
    stale: dict[str, str] = {}

    def fresh(name: str) -> bool:  # the result file is there and of the run's weights (else noted)
        path = results / name
        if not path.is_file():
            return False
        status, why = weights_status(run_dir, path, step)
        if status == STALE:
            stale[name] = why
        return status != STALE

    ablation = AblationResult.load(results / "ablation.json") if fresh("ablation.json") else None
    deposits = DepositReport.load(results / "deposits.json") if fresh("deposits.json") else None
    decomposition = read_json(results / DECOMPOSITION) if fresh(DECOMPOSITION) else None
    model_cfg = ModelConfig.from_dict(config["model"])
    label = encoding_label(spec)
    if label not in {known for known, _ in ENCODINGS}:
        label = model_cfg.encoding_name
    return CellInfo(
        id=run_dir.name,
        label=label,
        task=task,
        seed=int(config["train"].get("seed", 0)),
        kind=model_cfg.encoding_kind,
        params={"task": task, "encoding": spec, "preset": config.get("preset")},
        final=dict(metrics[-1]) if metrics else {},
        run_dir=run_dir,
        config=config,
        ablation=ablation if ablation is not None and ablation.is_grid else None,
        deposits=deposits,
        patching=PatchResult.load(results / "patching.json") if fresh("patching.json") else None,
        positional=PositionalScores.load(results / "positional.json")
        if fresh("positional.json")
        else None,
        attention=AttentionRecord.load(results / ATTENTION) if fresh(ATTENTION) else None,
        decomposition=decomposition,
        extra={"stale": stale} if stale else {},
    )


def load_cells(out_dir: str | Path) -> tuple[list[CellInfo], list[dict[str, Any]]]:
    """Every finished cell of a reproduce directory, and the error records of failed ones."""
    out_dir = Path(out_dir)
    results, errors = collect(out_dir)
    varying = _varying(results)
    return [load_cell(r, out_dir, varying) for r in results], errors


def label_order(cells: list[CellInfo]) -> list[str]:
    """Encoding labels grouped by kind, each kind in the order of the reproduce table."""
    known = [label for label, _ in ENCODINGS]
    labels = list(dict.fromkeys(c.label for c in cells))
    kind_of = {c.label: c.kind for c in cells}

    def key(label: str) -> tuple[int, int, str]:
        base = label.split(" [")[0]
        k = kind_of.get(label, "none")
        return (
            KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER),
            known.index(base) if base in known else len(known),
            label,
        )

    return sorted(labels, key=key)


def task_order(cells: list[CellInfo]) -> list[str]:
    tasks = list(dict.fromkeys(c.task for c in cells))
    return sorted(tasks, key=lambda t: (TASK_ORDER.index(t) if t in TASK_ORDER else 99, t))


@functools.lru_cache(maxsize=64)
def _baselines(task_json: str) -> dict[str, float]:
    task = task_from_dict(json.loads(task_json))
    return {
        "chance": task.chance_accuracy(),
        "length_only": task.length_only_accuracy(),
        "n_classes": task.n_classes,
        "max_len": task.max_len,
    }


def cell_baselines(cell: CellInfo) -> dict[str, float] | None:
    """Exact chance and length-only accuracies of this cell's own task configuration."""
    if not cell.config or "task" not in cell.config:
        return None
    return dict(_baselines(json.dumps(cell.config["task"], sort_keys=True)))


def task_baselines(cells: list[CellInfo]) -> dict[str, dict[str, float]]:
    """Exact chance and length-only accuracies of each task, from the task objects of the runs.

    A task whose runs have more than one configuration (another ``max_len``, another vocabulary,
    the authors' generator) has no single baseline and is left out: judge those cells with
    :func:`cell_baselines`."""
    out: dict[str, dict[str, float]] = {}
    for t in task_order(cells):
        configs = {
            json.dumps(c.config["task"], sort_keys=True)
            for c in cells
            if c.task == t and c.config and "task" in c.config
        }
        if len(configs) == 1:
            out[t] = dict(_baselines(configs.pop()))
    return out


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
        k: AccStat(
            statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v), tuple(v)
        )
        for k, v in groups.items()
    }


__all__ = [
    "CHECKPOINT_KEY",
    "CONTROL_PREFIX",
    "LARGE_DROP",
    "NOT_MEASURED",
    "NOT_REPRODUCED",
    "REPRODUCED",
    "SANITY_CHECK",
    "SMALL_DROP",
    "STATUSES",
    "AccStat",
    "CellInfo",
    "Dominance",
    "acc_stats",
    "cell_baselines",
    "ci_of",
    "dominance",
    "is_control",
    "label_order",
    "large_heads",
    "layer_deposit",
    "load_cells",
    "load_run_cell",
    "margins",
    "max_other",
    "task_baselines",
    "task_order",
    "top",
]

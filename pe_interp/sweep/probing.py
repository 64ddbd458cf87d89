"""What a sweep measures besides training: probes per cell, callbacks during training, and probes
over the whole sweep. Each writes its result with the result type's own ``save`` (or
``to_dict``, into the cell's ``result.json``), and the report reads them back with ``load`` /
``from_dict``.

- :data:`PROBES`: ``fn(run) -> record | None`` after a cell has trained (None: not applicable);
- :data:`CALLBACKS`: ``fn(cell) -> Callback`` that watch a cell while it trains;
- :data:`SWEEP_PROBES`: ``fn(sweep_dir, results)`` once the cells are done (idempotent: each
  recomputes only when what it depends on changed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pe_interp.config.presets import build_run_configs
from pe_interp.runs.checkpoint import save_result
from pe_interp.sweep.attention_probe import AttentionRecord, probe_attention
from pe_interp.sweep.gradients import sweep_gradients
from pe_interp.sweep.probe_files import (
    ABLATION,
    ATTENTION,
    DECOMPOSITION,
    DEPOSITS,
    GENERALIZATION,
    LAYER_ABLATION,
    PATCHING,
    POSITIONAL,
    ROTARY_KINDS,
    ROUTES,
    SNAPSHOT_DYNAMICS,
)
from probes import (
    AblationResult,
    DepositDynamics,
    DepositReport,
    ablate_heads,
    find_deposits,
    length_generalization,
    logit_terms,
    patch,
    positional_scores,
)

if TYPE_CHECKING:
    from pe_interp.runs.checkpoint import Run

__all__ = [
    "ATTENTION",
    "DECOMPOSITION",
    "CALLBACKS",
    "PROBE_OPTIONS",
    "PROBES",
    "SWEEP_PROBES",
    "AttentionRecord",
    "top_head",
]


# ---- per cell -------------------------------------------------------------------------------
def _probe_ablation(
    run: Run, n: int = 2000, on: str = "test", whole_layers: bool = False
) -> dict[str, Any]:
    """Zero-ablation of every head on the held-out split (``on="all"``: train + test, the
    authors' protocol), and deposit detection. ``whole_layers``: also every layer's heads
    ablated together, on the same examples (``layer_ablation.json``, ``"layers"`` in the record)."""
    test = run.examples(on, n)
    result = ablate_heads(
        run.model, test.tokens, test.labels, pad_mask=test.pad_mask, method="zero"
    )
    report = find_deposits(result)
    save_result(run.run_dir / ABLATION, result, run.provenance, per_example=False)
    save_result(run.run_dir / DEPOSITS, report, run.provenance)
    record = {"ablation": result.to_dict(per_example=False), "deposits": report.to_dict()}
    if whole_layers:
        cfg = run.model.cfg
        sets = [[(layer, h) for h in range(cfg.n_heads)] for layer in range(cfg.n_layers)]
        layers = ablate_heads(
            run.model,
            test.tokens,
            test.labels,
            pad_mask=test.pad_mask,
            method="zero",
            head_sets=sets,
        )
        save_result(run.run_dir / LAYER_ABLATION, layers, run.provenance, per_example=False)
        record["layers"] = layers.to_dict(per_example=False)
    return record


def _rotary_task1(run: Run) -> bool:
    return run.task.name == "distance" and run.model.cfg.encoding_kind in ROTARY_KINDS


def _probe_patching(run: Run, n: int = 256) -> dict[str, Any] | None:
    """Head-output patching with distance counterfactuals (task-1 rotary models only)."""
    if not _rotary_task1(run):
        return None
    pairs = run.task.counterfactual_pairs(n, seed=run.train_cfg.seed + 7919)
    result = patch(
        run.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        site="z",
        pad_mask=pairs.clean.pad_mask,
        clean_labels=pairs.clean.labels,
        corrupt_labels=pairs.corrupt.labels,
    )
    save_result(run.run_dir / PATCHING, result, run.provenance)
    return result.to_dict()


def _probe_positional(run: Run, n: int = 128, every_model: bool = False) -> dict[str, Any] | None:
    """Per-head positional scores (task-1 rotary models only; ``every_model``: any model)."""
    if not (every_model or _rotary_task1(run)):
        return None
    test = run.test_set(n)
    result = positional_scores(run.model, test.tokens, pad_mask=test.pad_mask)
    save_result(run.run_dir / POSITIONAL, result, run.provenance)
    return result.to_dict()


def _probe_generalization(
    run: Run, n: int = 1000, extras: list[int] | None = None
) -> dict[str, Any] | None:
    """Length generalisation (:func:`probes.length_generalization`) on fresh rows that are not in
    the run's training set; None for a task that cannot lengthen its inputs."""
    if not run.task.extensions:
        return None
    train, _ = run.task.splits(run.train_cfg.n_train, run.train_cfg.n_test, seed=run.train_cfg.seed)
    result = length_generalization(
        run.model,
        run.task,
        n=n,
        extras=extras,
        exclude=train,
        ignore_index=run.train_cfg.ignore_index,
        seed=run.train_cfg.seed,
    )
    save_result(run.run_dir / GENERALIZATION, result, run.provenance)
    return {
        "file": GENERALIZATION,
        "trained": result.trained.accuracy,
        **{f: result.family_mean(f) for f in result.families},
    }


def top_head(ablation: AblationResult, deposits: DepositReport) -> tuple[int, int, str]:
    """The head a cell's logit decomposition looks at: the top head of its concentrated layer (the shallowest),
    else the head whose ablation hurts most in the whole model."""
    if deposits.first is not None:
        layer, head = deposits.first
        return layer, head, "top head of a concentrated layer"
    filled = np.nan_to_num(ablation.drops, nan=-np.inf)
    layer, head = (int(i) for i in np.unravel_index(int(np.argmax(filled)), filled.shape))
    return (
        layer,
        head,
        f"top head by ablation (drop {100 * float(ablation.drops[layer, head]):.1f} pts)",
    )


def _probe_decomposition(run: Run, example: int = 0) -> dict[str, Any] | None:
    """The attention-logit terms of the top head (:func:`top_head`) on one held-out example, with
    the paper's grouping (task-1 models; needs the ablation probe first). Stores the term matrices
    so that the report can draw them (``decomposition.json``)."""
    if run.task.name != "distance" or not (run.run_dir / ABLATION).is_file():
        return None
    ablation = AblationResult.load(run.run_dir / ABLATION)
    if not ablation.is_grid:
        return None
    layer, head, why = top_head(ablation, DepositReport.load(run.run_dir / DEPOSITS))
    test = run.test_set(example + 1)
    terms = logit_terms(
        run.model, test.tokens, layer, head, pad_mask=test.pad_mask, example=example
    )
    n = int(terms.query_valid.sum())
    mats = dict(terms.grouped())
    mats["sum of terms"], mats["actual"] = terms.total, terms.actual

    def rounded(t) -> list:
        return np.round(t[:n, :n].detach().double().cpu().numpy(), 4).tolist()

    record = {
        "layer": layer,
        "head": head,
        "why": why,
        "example": example,
        "label": int(test.labels[example]),
        "summary": terms.to_dict(),
        "grouped_variance_shares": _shares(terms, mats),
        "matrices": {k: rounded(v) for k, v in mats.items()},
        "region": terms.region[:n, :n].cpu().numpy().tolist(),
    }
    save_result(run.run_dir / DECOMPOSITION, record, run.provenance, indent=None)
    return {"file": DECOMPOSITION, "layer": layer, "head": head, "why": why}


def _shares(terms, mats: dict[str, Any]) -> dict[str, float]:
    """Each grouped term's variance over the valid entries as a share of the total's."""
    region = terms.region
    total = terms.total[region].double().var(unbiased=False)
    return {
        k: float(v[region].double().var(unbiased=False) / total) if total > 0 else float("nan")
        for k, v in mats.items()
        if k not in ("sum of terms", "actual")
    }


def _probe_routes(run: Run, n: int = 512) -> dict[str, Any] | None:
    """Each route's share of the positional effect on ``n`` position-only pairs (the dynamics' pairs
    seed), and the positional verdict (:mod:`probes.routes.shares`; None: position changes no label,
    or nothing can move the model's positions: a bridge over BLOOM)."""
    from probes.deposit import (
        PAIRS_SEED_OFFSET,
        can_move_positions,
        positional_dominance,
        route_shares,
    )

    pairs = run.task.counterfactuals(
        n, kind="position", seed=run.train_cfg.seed + PAIRS_SEED_OFFSET
    )
    if not can_move_positions(run.model) or not bool(
        (pairs.clean.labels != pairs.corrupt.labels).any()
    ):
        return None
    result = route_shares(
        run.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.clean.pad_mask,
    )
    save_result(run.run_dir / ROUTES, result, run.provenance)
    verdict = positional_dominance(result)
    return {**result.to_dict(), "verdict": verdict.verdict, "why": verdict.why, "top": verdict.top}


def _probe_snapshot_dynamics(
    run: Run, n: int = 128, n_confirm: int = 1000, n_pairs: int = 128, positional: bool = True
) -> dict[str, Any] | None:
    """Every deposit criterion at every snapshot of the cell's run (``snapshots: log`` in the
    grid; None without snapshots): ``dynamics.json`` in the run, written after each snapshot so
    that a stopped sweep resumes the probe where it was."""
    from pe_interp.runs.snapshots import snapshot_steps
    from probes.deposit.trajectory import SnapshotDynamics, snapshot_dynamics

    path = run.run_dir / SNAPSHOT_DYNAMICS
    if not snapshot_steps(run.run_dir):
        return None
    result = snapshot_dynamics(
        run.run_dir,
        n=n,
        n_confirm=n_confirm,
        n_pairs=n_pairs,
        positional=positional,
        done=SnapshotDynamics.load(path) if path.is_file() else None,
        progress=False,
        on_record=lambda r: save_result(path, r, None, indent=None),
    )
    save_result(path, result, None, indent=None)
    return {"file": SNAPSHOT_DYNAMICS, **result.to_dict()}


def _dynamics_callback(
    cell: Any,
    points: int = 20,
    n_probe: int = 512,
    layers: tuple[int, ...] = (0,),
    every: int = 0,
) -> DepositDynamics:
    """Deposit dynamics of ``layers`` (default layer 0) on the first ``n_probe`` held-out
    examples, recorded every ``every`` steps, or (``every=0``) about ``points`` times over
    training (``cell``: a :class:`~pe_interp.sweep.Cell`)."""
    if not every:
        _, _, train_cfg = build_run_configs(seed=cell.seed, **cell.kwargs)
        every = max(1, train_cfg.total_steps // points)
    return DepositDynamics(every=every, layers=tuple(layers), n_probe=n_probe)


PROBES: dict[str, Callable[[Any], dict[str, Any] | None]] = {
    "ablation": _probe_ablation,
    "patching": _probe_patching,
    "positional": _probe_positional,
    "attention": probe_attention,
    "decomposition": _probe_decomposition,
    "generalization": _probe_generalization,
    "snapshot_dynamics": _probe_snapshot_dynamics,
    "routes": _probe_routes,
}
CALLBACKS: dict[str, Callable[[Any], Any]] = {"dynamics": _dynamics_callback}
# The keyword options a grid's ``probe_options`` may pass to each probe or callback.
PROBE_OPTIONS: dict[str, set[str]] = {
    "ablation": {"n", "on", "whole_layers"},
    "patching": {"n"},
    "positional": {"n", "every_model"},
    "generalization": {"n", "extras"},
    "decomposition": {"example"},
    "dynamics": {"points", "n_probe", "layers", "every"},
    "snapshot_dynamics": {"n", "n_confirm", "n_pairs", "positional"},
    "routes": {"n"},
}


SWEEP_PROBES: dict[str, Callable[[Path, list[dict[str, Any]]], None]] = {
    "gradients": sweep_gradients
}  # gradients.py

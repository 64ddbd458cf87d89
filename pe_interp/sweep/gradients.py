"""Probes over a whole sweep rather than one cell: C15's evidence, gradient coherence at
initialisation (:func:`probes.gradients.coherence.gradient_coherence`) for several encodings at the size of
the sweep's task-1 model, written to ``SWEEP_DIR/gradients.json`` and read back by the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pe_interp.config.model import ModelConfig
from pe_interp.tasks import task_from_dict
from pe_interp.util.io import atomic_write_json, read_json
from probes import gradient_coherence, load_coherence, save_coherence

# ---- over the whole sweep -----------------------------------------------------------------------
# C15's evidence: gradient coherence at initialisation for these encodings, at the size of the
# sweep's task-1 model, on one batch of task-1 examples, with the sweep's seeds as init seeds.
GRADIENT_ENCODINGS = ("rope", "alibi", "t5", "sinusoidal")
GRADIENT_N = 128
GRADIENT_BATCH_SEED = 15  # the batch is task.sample(GRADIENT_N, seed=GRADIENT_BATCH_SEED)
GRADIENTS = "gradients.json"


def _gradients_key(
    sweep_dir: Path, results: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(what the gradients depend on, the first task-1 run's config), or None without one."""
    for r in results:
        config = sweep_dir / "cells" / str(r.get("id")) / "run" / "config.json"
        if r.get("params", {}).get("task") == "distance" and config.is_file():
            run_config = read_json(config)
            cfg = dict(run_config["model"])
            cfg.pop("encoding", None)
            cfg["encoding"] = "rope"
            seeds = sorted({int(x.get("seed", 0)) for x in results})
            key = {
                "model": cfg,
                "task": run_config["task"],
                "seeds": seeds,
                "n": GRADIENT_N,
                "batch_seed": GRADIENT_BATCH_SEED,
                "encodings": list(GRADIENT_ENCODINGS),
            }
            return json.loads(json.dumps(key)), run_config
    return None


def sweep_gradients(sweep_dir: str | Path, results: list[dict[str, Any]]) -> None:
    """Write ``SWEEP_DIR/gradients.json`` (:func:`probes.gradients.coherence.save_coherence`), unless it is
    there already for the same model size, task, seeds and batch. A failure is recorded in the
    file (``error``) for the report to show."""
    sweep_dir = Path(sweep_dir)
    found = _gradients_key(sweep_dir, results)
    if found is None:
        return
    key, _ = found
    path = sweep_dir / GRADIENTS
    if path.is_file():
        try:
            stored = read_json(path)
        except ValueError:
            stored = {}
        if stored.get("key") == key and ("results" in stored or "error" in stored):
            return
    try:
        base = ModelConfig.from_dict(key["model"]).replace(dropout=0.0, attn_dropout=0.0)
        batch = task_from_dict(key["task"]).sample(GRADIENT_N, seed=GRADIENT_BATCH_SEED)
        coherence = {}
        for enc in GRADIENT_ENCODINGS:
            coherence[enc] = gradient_coherence(
                base.replace(encoding=enc), batch, init_seeds=key["seeds"]
            )
    except Exception as err:  # noqa: BLE001 - recorded; the report says why C15 is not measured
        atomic_write_json(
            path,
            {
                "key": key,
                "error": f"probes.gradients.coherence failed: {type(err).__name__}: {err}",
            },
        )
        return
    save_coherence(path, coherence, key=key)


def load_gradients(sweep_dir: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(results, None)`` from ``SWEEP_DIR/gradients.json`` (each encoding's
    :class:`~probes.CoherenceResult` as a dict), or ``(None, why)`` when there are none."""
    path = Path(sweep_dir) / GRADIENTS
    if not path.is_file():
        return None, (
            "needs a task-1 run (its model size and task); the sweep writes gradients.json "
            "(rerun `pe-interp reproduce` on a directory from before it did)"
        )
    stored = read_json(path)
    if "error" in stored:
        return None, stored["error"]
    coherence, _ = load_coherence(path)
    return {enc: r.to_dict() for enc, r in coherence.items()}, None


__all__ = [
    "GRADIENTS",
    "GRADIENT_BATCH_SEED",
    "GRADIENT_ENCODINGS",
    "GRADIENT_N",
    "load_gradients",
    "sweep_gradients",
]

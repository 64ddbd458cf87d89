"""C15 evidence: gradient "seeds" at initialisation, measured with ``probes.gradients``.

For RoPE, ALiBi, T5 and sinusoidal at the runs' own model size, on one batch of task-1 examples,
over the runs' seeds as initialisation seeds: the coherence of each head's per-example gradients
(``||mean g|| / mean ||g||``; about ``1/sqrt(n)`` for independent directions, 1 when every example
agrees). The result is cached in ``OUT/gradients.json`` (keyed by the model config, the batch
size and the seeds), so rebuilding the report does not recompute it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pe_interp.report.claims import NOT_MEASURED, NOT_REPRODUCED, REPRODUCED

ENCODINGS = ("rope", "alibi", "t5", "sinusoidal")
N_EXAMPLES = 128
BATCH_SEED = 15  # the task batch is task.sample(N_EXAMPLES, seed=BATCH_SEED)
CACHE = "gradients.json"

CRITERION = (
    "`probes.gradients.gradient_coherence` at initialisation (this run's model size, {n} task-1 "
    "examples, init seeds = the run's seeds): coherence = ‖mean_i g_i‖ / mean_i ‖g_i‖ of each "
    "head's per-example task-loss gradient (≈ 1/√n = {noise:.3f} for independent directions). "
    "Reproduced if the largest layer-0 head coherence, averaged over seeds, is ≥ 2/√n = {thr:.3f} "
    "for `rope` (a coherent seed) AND < 2/√n for `alibi` (cancels). This measures the whole "
    "task-loss gradient of each head's parameters, not a dedicated position-readout objective."
)


def threshold(n: int) -> float:
    """The coherence a head must reach to count as a coherent "seed": 2/√n (twice the noise level)."""
    return 2 / math.sqrt(n)


def criterion(n: int = N_EXAMPLES) -> str:
    """C15's criterion, as :func:`judge` applies it (claims.py states this very text)."""
    return CRITERION.format(n=n, noise=1 / math.sqrt(n), thr=threshold(n))


def _compute(cfg_dict: dict[str, Any], task_dict: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    from pe_interp.config import ModelConfig
    from pe_interp.tasks import task_from_dict
    from probes.gradients import gradient_coherence

    base = ModelConfig.from_dict(cfg_dict).replace(dropout=0.0, attn_dropout=0.0)
    batch = task_from_dict(task_dict).sample(N_EXAMPLES, seed=BATCH_SEED)
    out = {}
    for enc in ENCODINGS:
        r = gradient_coherence(base.replace(encoding=enc), batch, init_seeds=seeds)
        out[enc] = r.to_dict()
    return out


def gradient_evidence(cells: list[Any], out_dir: str | Path | None = None) -> dict[str, Any]:
    """The C15 verdict and evidence (``{"available": False, "reason": ...}`` when not measurable)."""
    try:
        import probes.gradients  # noqa: F401
    except ImportError as err:
        return {"available": False, "reason": f"probes.gradients is not available ({err})"}
    task1 = [c for c in cells if c.task == "distance" and c.config]
    if not task1:
        return {"available": False, "reason": "needs a task-1 run (its model size and task)"}
    cfg = dict(task1[0].config["model"])
    cfg.pop("encoding", None)
    cfg["encoding"] = "rope"
    task_dict = task1[0].config["task"]
    seeds = sorted({c.seed for c in cells})
    key = {"model": cfg, "task": task_dict, "seeds": seeds, "n": N_EXAMPLES, "batch_seed": BATCH_SEED,
           "encodings": list(ENCODINGS)}
    cache = Path(out_dir) / CACHE if out_dir is not None else None
    results = None
    if cache is not None and cache.is_file():
        try:
            stored = json.loads(cache.read_text())
            if stored.get("key") == json.loads(json.dumps(key)):
                results = stored["results"]
        except (json.JSONDecodeError, KeyError, TypeError):
            results = None
    if results is None:
        try:
            results = _compute(cfg, task_dict, seeds)
        except Exception as err:  # noqa: BLE001 - reported as not measured, with the reason
            return {"available": False, "reason": f"probes.gradients failed: {type(err).__name__}: {err}"}
        if cache is not None:
            from pe_interp.checkpoint import atomic_write_json

            atomic_write_json(cache, {"key": key, "results": results})
    return judge(results, N_EXAMPLES)


def layer0_max(record: dict[str, Any]) -> tuple[float, float]:
    """Mean and std over seeds of the largest layer-0 head coherence."""
    vals = [max((v for v in seed_vals[0] if v is not None and not math.isnan(v)), default=math.nan)
            for seed_vals in record["values"]]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return mean, std


def judge(results: dict[str, Any], n: int) -> dict[str, Any]:
    """C15's verdict: the one place its criterion (:func:`criterion`) is applied."""
    thr = threshold(n)
    stats = {enc: layer0_max(r) for enc, r in results.items()}
    parts = [f"{enc}: {m:.3f} ± {s:.3f}" for enc, (m, s) in stats.items()]
    if "rope" not in stats or "alibi" not in stats or math.isnan(stats["rope"][0] + stats["alibi"][0]):
        status = NOT_MEASURED
    else:
        status = REPRODUCED if stats["rope"][0] >= thr and stats["alibi"][0] < thr else NOT_REPRODUCED
    seeds = next(iter(results.values()))["seeds"] if results else []
    return {
        "available": True,
        "status": status,
        "criterion": criterion(n),
        "n": n,
        "evidence": (f"largest layer-0 head coherence (mean ± std over init seeds {seeds}, n={n}): "
                     + "; ".join(parts) + f"; 2/√n = {thr:.3f}"),
        "layer0_max": {enc: {"mean": m, "std": s} for enc, (m, s) in stats.items()},
        "results": results,
    }

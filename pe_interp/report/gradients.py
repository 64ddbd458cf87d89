"""C15's verdict from the gradient "seeds" the sweep measured at initialisation.

The sweep (:func:`pe_interp.sweep.gradients.sweep_gradients`) stores, in ``OUT/gradients.json``,
the coherence of each head's per-example gradients (``||mean g|| / mean ||g||``; about
``1/sqrt(n)`` for independent directions, 1 when every example agrees) for RoPE, ALiBi, T5 and
sinusoidal at the runs' own model size, on one batch of task-1 examples, over the runs' seeds as
initialisation seeds. This module reads it and applies C15's criterion.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pe_interp.report.data import NOT_MEASURED, NOT_REPRODUCED, REPRODUCED
from pe_interp.sweep.gradients import GRADIENT_N, load_gradients

N_EXAMPLES = GRADIENT_N

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


def gradient_evidence(out_dir: str | Path) -> dict[str, Any]:
    """The C15 verdict and evidence from ``OUT/gradients.json`` (``{"available": False,
    "reason": ...}`` when the sweep has none)."""
    results, why = load_gradients(out_dir)
    if results is None:
        return {"available": False, "reason": why}
    return judge(results, N_EXAMPLES)


def layer0_max(record: dict[str, Any]) -> tuple[float, float]:
    """Mean and std over seeds of the largest layer-0 head coherence."""
    vals = [
        max((v for v in seed_vals[0] if v is not None and not math.isnan(v)), default=math.nan)
        for seed_vals in record["values"]
    ]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return mean, std


def judge(results: dict[str, Any], n: int) -> dict[str, Any]:
    """C15's verdict: the one place its criterion (:func:`criterion`) is applied."""
    thr = threshold(n)
    stats = {enc: layer0_max(r) for enc, r in results.items()}
    parts = [f"{enc}: {m:.3f} ± {s:.3f}" for enc, (m, s) in stats.items()]
    if (
        "rope" not in stats
        or "alibi" not in stats
        or math.isnan(stats["rope"][0] + stats["alibi"][0])
    ):
        status = NOT_MEASURED
    else:
        status = (
            REPRODUCED if stats["rope"][0] >= thr and stats["alibi"][0] < thr else NOT_REPRODUCED
        )
    seeds = next(iter(results.values()))["seeds"] if results else []
    return {
        "available": True,
        "status": status,
        "criterion": criterion(n),
        "n": n,
        "evidence": (
            f"largest layer-0 head coherence (mean ± std over init seeds {seeds}, n={n}): "
            + "; ".join(parts)
            + f"; 2/√n = {thr:.3f}"
        ),
        "layer0_max": {enc: {"mean": m, "std": s} for enc, (m, s) in stats.items()},
        "results": results,
    }

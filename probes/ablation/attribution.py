"""``engine=Attribution(steps, path, verify_top)`` of :func:`probes.ablation.ablate_heads`
(``"attribution"``: the defaults): integrated gradients along the
ablation path (:func:`probes.ablation.ranking.rank_heads`) rank every head of the grid; the
``verify_top`` heads estimated to hurt most are then ablated exactly
(:func:`probes.ablation.exact.exact_engine`), and only they get a value.

``benchmarks/head_ranking.py`` measures the ranking against the exact grid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from probes.ablation.exact import exact_engine
from probes.ablation.request import AblationRequest
from probes.ablation.result import AblationResult, verification_summary
from probes.ablation.sampled import check_verify_top
from probes.common.options import INTEGRATION_PATHS, IntegrationPath


@dataclass(frozen=True)
class Attribution:
    """Every head ranked by integrated gradients along the ablation path (``steps``
    Gauss-Legendre nodes, along ``path``: ``"joint"``, every layer at once, or ``"layer"``), then
    the ``verify_top`` heads estimated to hurt most ablated exactly (module docstring). Runs in
    float32 whatever ``amp`` says."""

    steps: int = 4
    path: IntegrationPath = "joint"
    verify_top: int = 3
    name = "attribution"
    grid_only = True

    def __post_init__(self) -> None:
        st = self.steps
        if not isinstance(st, int) or isinstance(st, bool) or st < 1:
            raise ValueError(f"steps must be a positive integer, got {st!r}")
        if self.path not in INTEGRATION_PATHS:
            raise ValueError(
                f"path must be one of {', '.join(INTEGRATION_PATHS)}; got {self.path!r}"
            )
        if self.path == "clean" and st != 1:
            raise ValueError(
                f"path 'clean' takes the derivative at one point: steps must be 1, got {st}"
            )
        check_verify_top(self.verify_top)

    def run(self, req: AblationRequest) -> AblationResult:
        return attribution_engine(
            dataclasses.replace(req, amp=False),
            verify_top=self.verify_top,
            steps=self.steps,
            path=self.path,
        )


def attribution_engine(
    req: AblationRequest, *, verify_top: int, steps: int, path: str
) -> AblationResult:
    """The grid with the verified heads' exact values and NaN elsewhere; ``meta`` holds the
    estimates (``"attribution"``), the stand-in metric, the verified heads and ``"verification"``."""
    from probes.ablation.ranking import rank_heads

    m = req.metric
    if m.name in ("accuracy", "loss", "logit"):
        stand_in: Any = m.name
    else:  # a callable: integrate it itself (higher is better unless told otherwise)
        sign = 1.0 if m.higher_is_better else -1.0
        stand_in = lambda logits, lab: sign * m.fn(logits, lab)  # noqa: E731
    est = rank_heads(
        req.model,
        req.tokens,
        req.labels,
        req.pad_mask,
        method=req.method,
        reference=req.reference,
        seed=req.seed,
        surrogate=stand_in,
        steps=steps,
        path=path,
        batch_size=req.batch_size,
    )
    grid, tie = est["estimate"], est["tiebreak"]
    order = [u[0] for u in sorted(req.units, key=lambda u: (-grid[u[0]], -tie[u[0]]))[:verify_top]]
    exact = exact_engine(dataclasses.replace(req, units=[(h,) for h in order], grid=False))
    L, H = req.model.cfg.n_layers, req.model.cfg.n_heads

    def place(x: np.ndarray | None) -> np.ndarray | None:
        if x is None:
            return None
        out = np.full((L, H) + x.shape[1:], np.nan)
        for i, (layer, h) in enumerate(order):
            out[layer, h] = x[i]
        return out

    verification = verification_summary(
        order, [float(grid[h]) for h in order], [float(v) for v in exact.drops]
    )
    meta = {
        **exact.meta,
        "engine": "attribution",
        "stand_in": m.name if isinstance(stand_in, str) else f"{m.name} (itself)",
        "steps": steps,
        "path": path,
        "attribution": grid.tolist(),
        "tiebreak": tie.tolist(),
        "verified": verification["heads"],
        "verification": verification,
    }
    return dataclasses.replace(
        exact,
        values=place(exact.values),
        drops=place(exact.drops),
        ci_low=place(exact.ci_low),
        ci_high=place(exact.ci_high),
        per_example=place(exact.per_example),
        head_sets=None,
        meta=meta,
    )


__all__ = ["Attribution", "attribution_engine"]

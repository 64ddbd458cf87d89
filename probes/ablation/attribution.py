"""``engine=Attribution(steps, path, verify_top)`` of :func:`probes.ablation.ablate_heads`
(``"attribution"``: the defaults): integrated gradients along the
ablation path (:func:`probes.ablation.ranking.rank_heads`) rank every head of the grid; the
``verify_top`` heads estimated to hurt most are then ablated exactly
(:func:`probes.ablation.exact.exact_engine`), and only they get a value.

With ``path="hvp"`` (the clean point's second-order estimate) this is Screen-Flag-Fix (Zhang &
Wang 2026, arXiv 2606.09899): the heads the estimate flags as unreliable (second-order term
larger than the first) are verified too, after the top ``verify_top``: at most ``verify_flagged``
of them (None: all), those with the largest second-order term first.

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
    Gauss-Legendre nodes, along ``path``: ``"joint"``, every layer at once, or ``"layer"``; or at
    the clean point: ``"clean"``, AtP, or ``"hvp"``, its second-order estimate from ``steps``
    Hessian-vector probes), then the ``verify_top`` heads estimated to hurt most ablated exactly,
    and with ``"hvp"`` up to ``verify_flagged`` flagged heads (module docstring). Runs in float32
    whatever ``amp`` says."""

    steps: int = 4
    path: IntegrationPath = "joint"
    verify_top: int = 3
    verify_flagged: int | None = None
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
        f = self.verify_flagged
        if f is not None and (not isinstance(f, int) or isinstance(f, bool) or f < 0):
            raise ValueError(f"verify_flagged must be None or an integer >= 0, got {f!r}")
        if f is not None and self.path != "hvp":
            raise ValueError(
                f"verify_flagged is for path 'hvp' (only it flags heads), got path {self.path!r}"
            )

    def run(self, req: AblationRequest) -> AblationResult:
        return attribution_engine(
            dataclasses.replace(req, amp=False),
            verify_top=self.verify_top,
            steps=self.steps,
            path=self.path,
            verify_flagged=self.verify_flagged,
        )


def screen_flag_fix(
    units: list, est: dict[str, Any], verify_top: int, verify_flagged: int | None
) -> tuple[list, list]:
    """The heads to ablate exactly, and the flagged ones among them: the top ``verify_top`` of
    ``units`` by :func:`probes.ablation.ranking.rank_heads`' estimate ``est`` (ties by the tiebreak),
    then (``"hvp"``) up to ``verify_flagged`` (None: all) of its flagged heads not yet in, largest
    second-order term first."""
    grid, tie = est["estimate"], est["tiebreak"]
    heads = [u[0] for u in units]
    order = sorted(heads, key=lambda h: (-grid[h], -tie[h]))[:verify_top]
    if "flagged" not in est:
        return order, []
    size = np.abs(est["second_order"])
    flagged = sorted(
        (h for h in heads if est["flagged"][h] and h not in order), key=lambda h: -size[h]
    )
    flagged = flagged if verify_flagged is None else flagged[:verify_flagged]
    return order + flagged, flagged


def attribution_engine(
    req: AblationRequest,
    *,
    verify_top: int,
    steps: int,
    path: str,
    verify_flagged: int | None = None,
) -> AblationResult:
    """The grid with the verified heads' exact values and NaN elsewhere; ``meta`` holds the
    estimates (``"attribution"``), the stand-in metric, the verified heads and ``"verification"``;
    ``path="hvp"`` adds ``"first_order"``, ``"reliability"`` and ``"flagged"`` (every flagged head,
    verified or not) and ``"verified_flagged"``."""
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
    order, fixed = screen_flag_fix(req.units, est, verify_top, verify_flagged)
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
    if "flagged" in est:
        meta["first_order"] = est["first_order"].tolist()
        meta["reliability"] = est["reliability"].tolist()
        meta["flagged"] = [[int(x) for x in h] for h in np.argwhere(est["flagged"])]
        meta["verified_flagged"] = [list(h) for h in fixed]
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


__all__ = ["Attribution", "attribution_engine", "screen_flag_fix"]

"""``engine=Sampled(share, verify_top)`` of :func:`probes.ablation.ablate_heads` (``"sampled"``: the
defaults): the exact grid on a seeded random ``share`` of the examples, then the ``verify_top``
heads with the largest drops there
ablated exactly on every example. Each drop is a paired difference on the examples it was
measured on, so a head's sampled drop is an unbiased estimate of its drop on all of them, with a
bootstrap interval over the sample; what it loses is sampling precision, which the interval
states. Cost: ``share`` of the grid plus ``verify_top`` single ablations.

``benchmarks/head_ranking.py`` measures it against the exact grid, with the exact grid's own
split-half agreement as the ceiling any estimate can reach.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from probes.ablation.exact import exact_engine
from probes.ablation.request import AblationRequest
from probes.ablation.result import AblationResult, verification_summary


def check_verify_top(verify_top: object) -> int:
    """``verify_top`` as a positive int (one-line ValueError else)."""
    if not isinstance(verify_top, int) or isinstance(verify_top, bool) or verify_top < 1:
        raise ValueError(f"verify_top must be a positive integer, got {verify_top!r}")
    return verify_top


@dataclass(frozen=True)
class Sampled:
    """The exact grid on a seeded ``share`` of the examples, then the ``verify_top`` heads with the
    largest drops there on every example (module docstring)."""

    share: float = 0.2
    verify_top: int = 3
    name = "sampled"
    grid_only = True

    def __post_init__(self) -> None:
        s = self.share
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= 1:
            raise ValueError(f"share must be a share of the examples in (0, 1], got {s!r}")
        check_verify_top(self.verify_top)

    def run(self, req: AblationRequest) -> AblationResult:
        return sampled_engine(req, sample=self.share, verify_top=self.verify_top)


def sampled_engine(req: AblationRequest, *, sample: float, verify_top: int) -> AblationResult:
    """Returns the whole grid: the verified heads' values on every example, the others' sampled drops
    (``values`` there are the full baseline less that drop, so ``drops`` stays ``harm(baseline,
    values)``) with their intervals over the sample. ``per_example`` holds the sampled heads'
    values at the sampled examples (NaN at the others). ``meta``: ``"sample"`` (the share),
    ``"n_sample"``, ``"sample_indices"``, ``"verified"`` and ``"verification"`` (sampled against
    exact drops of the verified heads)."""
    n = len(req.tokens)
    k = min(n, max(2, math.ceil(sample * n)))
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(req.seed))[:k].sort().values
    on = idx.to(req.tokens.device)
    # mean and resample take their values from the evaluated set, not from the sample (resample:
    # each sampled example draws its source from it uniformly, see probes.common.replace)
    ref = (
        (req.tokens, req.pad_mask)
        if req.reference is None and req.method != "zero"
        else req.reference
    )
    screen = exact_engine(
        dataclasses.replace(
            req,
            tokens=req.tokens[on],
            labels=req.labels[on],
            pad_mask=req.pad_mask[on],
            reference=ref,
        )
    )
    heads = [u[0] for u in req.units]
    order = sorted(heads, key=lambda h: -screen.drops[h])[: min(verify_top, len(heads))]
    exact = exact_engine(dataclasses.replace(req, units=[(h,) for h in order], grid=False))
    drops, low, high = screen.drops.copy(), screen.ci_low.copy(), screen.ci_high.copy()
    for i, h in enumerate(order):
        drops[h], low[h], high[h] = exact.drops[i], exact.ci_low[i], exact.ci_high[i]
    sign = 1.0 if req.metric.higher_is_better else -1.0
    values = exact.baseline - sign * drops  # drops == harm(baseline, values)
    pe = None
    if req.per_example:
        pe = np.full(drops.shape + (n,), np.nan)
        pe[..., idx.numpy()] = screen.per_example
        for i, h in enumerate(order):
            pe[h] = exact.per_example[i]
    verification = verification_summary(
        order, [float(screen.drops[h]) for h in order], [float(d) for d in exact.drops]
    )
    meta = {
        **exact.meta,
        "engine": "sampled",
        "sample": float(sample),
        "n_sample": k,
        "sample_indices": idx.tolist(),
        "verified": verification["heads"],
        "verification": verification,
    }
    return dataclasses.replace(
        exact,
        values=values,
        drops=drops,
        ci_low=low,
        ci_high=high,
        per_example=pe,
        head_sets=None,
        meta=meta,
    )


__all__ = ["Sampled", "check_verify_top", "sampled_engine"]

"""The one definition of a **single-head deposit**, and how thresholds meet measured drops.

A model has a single-head deposit when exactly one head of the whole model costs at least
:data:`LARGE_DROP` (50 accuracy points) when zero-ablated alone and every other head's ablation
moves accuracy by at most :data:`SMALL_DROP` (5 points) **either way** (a head whose removal
*raises* accuracy by 6 points is not negligible either). This is what the paper's claims C7/C8
say ("one first-layer head ... about 60 points; any other head almost nothing"), and it is what
the demo's headline, ``pe-interp show``, the report, the claims and the deposit study call a
deposit. The looser per-layer flag of :func:`probes.deposit.find_deposits` (one head carries
most of *its layer's* drop) is called a **layer concentration**, never a deposit.

Accuracy drops are multiples of ``1 / n_examples``; computed in floating point an exact 50-point
drop can come out as 0.49999999999999994. Every threshold here is therefore compared with a
tolerance far below one example's worth (:data:`GRANULE_TOL`): the comparison is the one at the
evaluation set's granularity, and no boundary flips on rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from probes.ablation import AblationResult

__all__ = [
    "GRANULE_TOL",
    "LARGE_DROP",
    "SMALL_DROP",
    "Dominance",
    "at_least",
    "at_most",
    "dominance",
]

LARGE_DROP = 0.50  # "about 60 points" (C7): at least 50
SMALL_DROP = 0.05  # "almost nothing" (C8): within 5 points, either way
# Far below 1 / n for any evaluation set (n <= 10^6), far above float64 rounding of k / n.
GRANULE_TOL = 1e-9


def at_least(x: float, threshold: float) -> bool:
    """``x >= threshold`` at the evaluation set's granularity (False for NaN)."""
    return bool(x >= threshold - GRANULE_TOL)


def at_most(x: float, threshold: float) -> bool:
    """``x <= threshold`` at the evaluation set's granularity (False for NaN)."""
    return bool(x <= threshold + GRANULE_TOL)


@dataclass(frozen=True)
class Dominance:
    """Whether one model has a single-head deposit, with the numbers behind the verdict."""

    layer: int  # the top head (largest drop in the whole model; the lower index on a tie)
    head: int
    drop: float
    runner_up: float  # the largest drop among all other heads
    others_max_abs: float  # the largest |drop| among all other heads (C8 is two-sided)
    share: float  # the top head's share of the model's summed positive drops
    n_large: int  # heads with a drop >= LARGE_DROP
    baseline: float

    @property
    def top_large(self) -> bool:
        return at_least(self.drop, LARGE_DROP)

    @property
    def others_small(self) -> bool:
        """Every other head moves the metric by at most SMALL_DROP, either way."""
        return at_most(self.others_max_abs, SMALL_DROP)

    @property
    def single(self) -> bool:
        """The single-head deposit: exactly one head with a large drop, every other small.
        (A tie for the top cannot pass: the runner-up would be large too.)"""
        return self.top_large and self.n_large == 1 and self.others_small

    @property
    def room(self) -> bool:
        """Could this model show a large drop at all (baseline >= LARGE_DROP)?"""
        return at_least(self.baseline, LARGE_DROP)

    def text(self) -> str:
        return (
            f"top L{self.layer}H{self.head} drop {100 * self.drop:.1f} pts of baseline "
            f"{100 * self.baseline:.1f}%, runner-up {100 * self.runner_up:.1f} pts (largest other |drop| "
            f"{100 * self.others_max_abs:.1f}), top share {100 * self.share:.0f}%, heads ≥ "
            f"{100 * LARGE_DROP:.0f} pts: {self.n_large} → "
            + ("single-head deposit" if self.single else "no single-head deposit")
        )


def dominance(a: AblationResult) -> Dominance:
    """The :class:`Dominance` of one single-head ablation grid (every head swept)."""
    if not a.is_grid:
        raise ValueError("dominance needs a layers x heads ablation grid, not head sets")
    if np.isnan(a.drops).any():
        missing = int(np.isnan(a.drops).sum())
        raise ValueError(
            f"dominance needs every head's drop; {missing} of {a.drops.size} are missing "
            "(a partial grid cannot say that every other head is negligible)"
        )
    flat = a.drops.ravel()
    top = int(np.argmax(flat))  # first maximum: the lower (layer, head) on a tie
    layer, head = divmod(top, a.n_heads)
    others = np.delete(flat, top)
    pos = np.clip(flat, 0.0, None)
    share = float(pos[top] / pos.sum()) if pos.sum() > 0 else 0.0
    return Dominance(
        layer=layer,
        head=head,
        drop=float(flat[top]),
        runner_up=float(others.max()) if others.size else -math.inf,
        others_max_abs=float(np.abs(others).max()) if others.size else 0.0,
        share=share,
        n_large=int(sum(at_least(float(x), LARGE_DROP) for x in flat)),
        baseline=a.baseline,
    )

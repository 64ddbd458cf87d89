"""Verdicts that the data can support: "yes", "no", or "undecided (n = ..., need >= ...)".

A criterion compares measured drops with thresholds. On a finite evaluation set each drop has a
bootstrap interval, and a verdict is decided only where the intervals clear the thresholds it
depends on; otherwise it is **undecided**, with an estimate of how many examples would decide
it: an interval's half-width shrinks as ``1 / sqrt(n)``, so a comparison whose point estimate is
``gap`` away from its threshold with half-width ``w`` at ``n`` examples is decided at about
``n * (w / gap)^2``.

- :func:`decide_single`: the single-head deposit (:func:`probes.deposit.dominance`): "yes" when
  the top head's interval lies at or above 50 points and every other head's inside ±5; "no" when
  no head's interval reaches 50 points, or when two heads' intervals lie outside ±5 (whichever
  is on top, another is not negligible).
- below :func:`min_examples` (59 at a 95% interval for the 5-point bar) every verdict is
  undecided: a percentile bootstrap over a handful of examples gives intervals of zero width (one
  example: ``[d, d]``), which cannot cover a drop that none of them showed.
- :func:`decide_concentration`: layer concentration (:func:`probes.find_concentrations`) in one
  layer: its point criteria (share, tie, separation) as they are, with the top drop's interval
  against the 20-point bar deciding whether "large" holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from probes.ablation import AblationResult
from probes.deposit.detection import DEFAULT_MIN_DROP_ACCURACY, layer_stats
from probes.deposit.dominance import GRANULE_TOL, LARGE_DROP, SMALL_DROP

YES, NO, UNDECIDED = "yes", "no", "undecided"

__all__ = [
    "NO",
    "UNDECIDED",
    "YES",
    "Decision",
    "decide_concentration",
    "decide_single",
    "examples_needed",
    "min_examples",
    "too_few",
]


@dataclass(frozen=True)
class Decision:
    verdict: str  # YES, NO or UNDECIDED
    why: str
    n_examples: int
    need: int | None = None  # examples that would decide an undecided verdict (None: unknown)

    def text(self) -> str:
        if self.verdict != UNDECIDED:
            return f"{self.verdict} ({self.why})"
        need = f"need ≥ {self.need:,}" if self.need else "more examples needed"
        return f"undecided (n = {self.n_examples:,}, {need}; {self.why})"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "why": self.why,
            "n_examples": self.n_examples,
            "need": self.need,
        }


def examples_needed(n: int, point: float, low: float, high: float, threshold: float) -> int | None:
    """About how many examples put the interval ``[low, high]`` (at ``n``) clear of ``threshold``."""
    gap = abs(point - threshold)
    half = max(point - low, high - point)
    if gap <= GRANULE_TOL or not math.isfinite(half):
        return None
    return int(math.ceil(n * (half / gap) ** 2 - 1e-9))  # less float noise: 0.15 / 0.1 is 1.4999...


def min_examples(ci: float, bar: float) -> int:
    """The fewest examples whose bootstrap interval can bound a drop within ``bar``: an outcome seen
    in none of ``n`` examples still has a ``ci`` upper bound of ``1 - (1 - ci)^(1/n)`` (the exact
    binomial bound), which is below ``bar`` only from ``ln(1 - ci) / ln(1 - bar)`` examples on."""
    return int(math.ceil(math.log(1.0 - ci) / math.log(1.0 - bar) - 1e-9))


def too_few(a: AblationResult, bar: float = SMALL_DROP) -> Decision | None:
    """An undecided verdict where ``a`` has too few examples for its intervals to decide at
    ``bar`` (:func:`min_examples`), else None."""
    need = min_examples(a.ci, bar)
    if a.n_examples >= need:
        return None
    why = (
        f"a bootstrap over {a.n_examples} example{'s' * (a.n_examples != 1)} cannot bound a drop "
        f"to {100 * bar:.0f} points at {100 * a.ci:.0f}%"
    )
    return Decision(UNDECIDED, why, a.n_examples, need)


def _need(items: list[int | None]) -> int | None:
    return None if not items or any(i is None for i in items) else max(items)


def decide_single(a: AblationResult) -> Decision:
    """The single-head deposit, decided on the bootstrap intervals (module docstring)."""
    if not a.is_grid or np.isnan(a.drops).any():
        raise ValueError("decide_single needs a full layers x heads ablation grid")
    n = a.n_examples
    d, lo, hi = a.drops.ravel(), a.ci_low.ravel(), a.ci_high.ravel()
    if np.isnan(lo).any():
        raise ValueError("decide_single needs bootstrap intervals (n_bootstrap > 0)")
    if (few := too_few(a)) is not None:
        return few
    top = int(np.argmax(d))
    outside = [
        i
        for i in range(d.size)
        if lo[i] > SMALL_DROP + GRANULE_TOL or hi[i] < -SMALL_DROP - GRANULE_TOL
    ]
    if hi.max() < LARGE_DROP - GRANULE_TOL:
        return Decision(NO, f"no head's interval reaches {100 * LARGE_DROP:.0f} points", n)
    if len(outside) >= 2:
        return Decision(
            NO, f"{len(outside)} heads' intervals lie outside ±{100 * SMALL_DROP:.0f} points", n
        )
    others = [i for i in range(d.size) if i != top]
    if lo[top] >= LARGE_DROP - GRANULE_TOL and all(
        lo[i] >= -SMALL_DROP - GRANULE_TOL and hi[i] <= SMALL_DROP + GRANULE_TOL for i in others
    ):
        return Decision(
            YES,
            f"top head ≥ {100 * LARGE_DROP:.0f} points, every other within ±{100 * SMALL_DROP:.0f}",
            n,
        )
    needs = []
    if lo[top] < LARGE_DROP - GRANULE_TOL:
        needs.append(examples_needed(n, d[top], lo[top], hi[top], LARGE_DROP))
    for i in others:
        if lo[i] < -SMALL_DROP - GRANULE_TOL or hi[i] > SMALL_DROP + GRANULE_TOL:
            needs.append(
                examples_needed(n, d[i], lo[i], hi[i], SMALL_DROP if d[i] >= 0 else -SMALL_DROP)
            )
    return Decision(UNDECIDED, "intervals reach across the 50- or 5-point bar", n, _need(needs))


def decide_concentration(
    a: AblationResult, layer: int = 0, min_drop: float = DEFAULT_MIN_DROP_ACCURACY
) -> Decision:
    """Layer concentration of ``layer``, with the top drop's interval against ``min_drop``."""
    s = layer_stats(
        a.drops[layer], a.ci_low[layer], a.ci_high[layer], layer=layer, min_drop=min_drop
    )
    n = a.n_examples
    if s is None:
        raise ValueError(f"decide_concentration: layer {layer} was not ablated")
    if (few := too_few(a)) is not None:
        return few
    lo, hi = s.top_ci
    other_failures = [f for f in s.failed if not f.startswith("top drop")]
    if other_failures:
        return Decision(NO, other_failures[0], n)
    if lo >= min_drop - GRANULE_TOL:
        return Decision(
            YES,
            f"L{layer}H{s.top_head} ≥ {100 * min_drop:.0f} points, share {100 * s.share:.0f}%",
            n,
        )
    if hi < min_drop - GRANULE_TOL:
        return Decision(NO, f"the top head's interval lies below {100 * min_drop:.0f} points", n)
    return Decision(
        UNDECIDED,
        f"L{layer}H{s.top_head}'s interval reaches across {100 * min_drop:.0f} points",
        n,
        examples_needed(n, s.top_drop, lo, hi, min_drop),
    )

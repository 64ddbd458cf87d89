"""Barbero et al.'s two findings on RoPE frequencies ("Round and Round We Go!", arXiv 2410.06205),
as counts of heads with an interval, from a :class:`~probes.decomposition.FrequencyUsage`:

1. :func:`low_frequency_norm`, "most of the queries' and keys' norm sits in the lowest
   frequencies": ``k`` of the ``n`` rotated query heads whose low band holds a larger share of
   the q/k chunk norms than their high band (:meth:`FrequencyUsage.norm_bands`);
2. :func:`high_frequency_positional`, "positional heads use the highest frequencies": ``k`` of
   the ``n`` given positional heads whose high band holds a larger share of the squared logit
   terms, centred along each query's row (what can shape the pattern), than their low band
   (:meth:`FrequencyUsage.logit_bands`; the raw terms or the q/k norms: ``measure``).

Which heads are positional is the caller's choice (:func:`top_heads` of a ``[layers, heads]``
score, e.g. :attr:`probes.PositionalScores.scores` or previous-token attention). The interval is
Wilson's score interval on ``k / n`` (:func:`probes.common.metrics.wilson`): over these heads of this
model on these prompts, not over models.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from probes.common.metrics import wilson
from probes.decomposition.frequency import FrequencyUsage

__all__ = ["BandFinding", "high_frequency_positional", "low_frequency_norm", "top_heads"]

Head = tuple[int, int]


@dataclass(frozen=True)
class BandFinding:
    """``k`` of ``n`` heads show ``claim``; ``interval``: Wilson's at ``level``; ``heads``: the
    heads counted, ``hits`` those that show it; ``high``/``low``: each counted head's band shares."""

    claim: str
    k: int
    n: int
    interval: tuple[float, float]
    level: float
    heads: tuple[Head, ...]
    hits: tuple[Head, ...]
    high: tuple[float, ...]
    low: tuple[float, ...]

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else math.nan

    def text(self) -> str:
        lo, hi = self.interval
        return (
            f"{self.claim}: {self.k} of {self.n} heads ({100 * self.rate:.0f}%, "
            f"{100 * self.level:.0f}% Wilson interval {100 * lo:.0f}-{100 * hi:.0f}%)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "k": self.k,
            "n": self.n,
            "interval": list(self.interval),
            "level": self.level,
            "heads": [list(h) for h in self.heads],
            "hits": [list(h) for h in self.hits],
            "high": list(self.high),
            "low": list(self.low),
        }


def _finding(
    claim: str,
    high: Tensor,
    low: Tensor,
    heads: list[Head],
    usage: FrequencyUsage,
    level: float,
    larger: str,
) -> BandFinding:
    """Count the ``heads`` (those with both band shares finite) whose ``larger`` band
    (``"high"`` or ``"low"``) holds the larger share."""
    hi = [float(high[usage.row(layer), h]) for layer, h in heads]
    lo = [float(low[usage.row(layer), h]) for layer, h in heads]
    keep = [i for i in range(len(heads)) if math.isfinite(hi[i]) and math.isfinite(lo[i])]
    heads, hi, lo = [heads[i] for i in keep], [hi[i] for i in keep], [lo[i] for i in keep]
    hits = tuple(h for h, a, b in zip(heads, hi, lo) if (a > b if larger == "high" else b > a))
    return BandFinding(
        claim=claim,
        k=len(hits),
        n=len(heads),
        interval=wilson(len(hits), len(heads), level),
        level=level,
        heads=tuple(heads),
        hits=hits,
        high=tuple(hi),
        low=tuple(lo),
    )


def low_frequency_norm(
    usage: FrequencyUsage, *, which: str = "qk", level: float = 0.95
) -> BandFinding:
    """Finding 1: the rotated query heads (every head of every measured layer that is rotated)
    whose **low** band holds more of the chunk norms than their high band (``which``: ``"qk"``,
    the queries' and keys' shares averaged; ``"q"`` or ``"k"`` alone)."""
    high, low = usage.norm_bands(which)
    heads = [(layer, h) for layer in usage.layers for h in range(high.shape[1])]
    claim = "q/k norm sits in the lowest frequencies"
    return _finding(claim, high, low, heads, usage, level, "low")


MEASURES = ("logit", "pattern", "norm")


def high_frequency_positional(
    usage: FrequencyUsage, heads: Iterable[Head], *, measure: str = "pattern", level: float = 0.95
) -> BandFinding:
    """Finding 2: of the positional ``heads`` ((layer, head) pairs in the measured layers), those
    whose **high** band holds a larger share than their low band of ``measure``:

    - ``"pattern"`` (default): the squared logit terms centred along each query's row
      (:attr:`FrequencyUsage.pattern_share`), the part of each frequency's term that can shape
      the attention pattern. The claim is about building positional patterns, and the softmax
      ignores what is constant along a row: on SmolLM2-135M the previous-token heads' raw squared
      terms sit mostly in the low band (large, slowly turning chunks that shift whole rows), while
      their centred terms sit mostly in the high band (L1H2: 98% high, 2% low);
    - ``"logit"``: the raw squared logit terms (:attr:`FrequencyUsage.logit_share`,
      :meth:`RopeTerms.frequency_share` over the allowed entries);
    - ``"norm"``: the q/k chunk norms of those heads (:attr:`FrequencyUsage.norm_share`)."""
    heads = [(int(a), int(b)) for a, b in heads]
    if not heads:
        raise ValueError("high_frequency_positional: no positional heads given")
    if measure not in MEASURES:
        raise ValueError(
            f"high_frequency_positional: measure must be one of {MEASURES}, got {measure!r}"
        )
    for layer, h in heads:
        usage.row(layer)
        if not 0 <= h < usage.logit_share.shape[1]:
            raise ValueError(f"head {h} is out of range (0..{usage.logit_share.shape[1] - 1})")
    if measure == "norm":
        high, low = usage.norm_bands()
    else:
        high, low = usage.logit_bands(centred=measure == "pattern")
    claim = f"positional heads use the highest frequencies ({measure})"
    return _finding(claim, high, low, heads, usage, level, "high")


def top_heads(scores: Any, k: int, layers: Iterable[int] | None = None) -> list[Head]:
    """The ``k`` (layer, head) pairs with the highest ``scores [n_layers, n_heads]`` (NaN last),
    within ``layers`` when given, highest first."""
    s = torch.as_tensor(scores, dtype=torch.float64).clone()
    if s.ndim != 2:
        raise ValueError(f"top_heads: scores must be [n_layers, n_heads], got {tuple(s.shape)}")
    if layers is not None:
        keep = torch.zeros(s.shape[0], dtype=torch.bool)
        keep[list(layers)] = True
        s[~keep] = math.nan
    s = torch.nan_to_num(s, nan=-math.inf)
    k = min(int(k), int(torch.isfinite(s).sum()))
    idx = torch.sort(-s.flatten(), stable=True).indices[:k]
    return [divmod(int(i), s.shape[1]) for i in idx]

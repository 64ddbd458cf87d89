"""Route shares screened by attribution: every head's route estimated at once, the largest exact.

Exact route shares (:func:`probes.routes.shares.route_shares`) run one restarted copy of the
forward per route head, from the head's layer on: ``(L + 1) / 2`` layers per head on average,
about 146 forwards of the prompts for SmolLM2's 270 heads. With ``screen=k`` it first estimates
every head's numerator ``ld(x) - ld(x; h sees σ)`` at once and then measures only the ``k`` heads
of largest estimate (in absolute value) exactly:

- **The estimate** is :func:`probes.ablation.ranking.rank_heads` with the moved outputs as the
  replacement (:class:`~probes.routes.moving.MovedOutputs`) on the path ``z' + a (z - z')`` of
  each route head: by default (``path="clean"``, attribution patching) the derivative of the
  logit difference at ``a = 1``, every route live, as when one route moves alone (one forward and
  backward of the prompts); ``path="joint"`` integrates it with every route at one ``a``
  (``steps`` Gauss-Legendre nodes). Either is a first-order estimate: a head whose effect runs
  through later attention's softmax can be ranked too low, so the screen can miss a route; the
  benchmark measures how often (``benchmarks/smollm2.py --part routes``).
- **The moved outputs** ``z'`` are computed once for every pair (:class:`MovedOnce`) and read by
  both the screen and the exact sweep.

A screened :class:`~probes.routes.result.RouteShares` has no share for the heads it did
not measure (NaN, as its intervals) and keeps every route head's estimated share in
``estimates``; :func:`~probes.deposit.positional.positional_dominance` decides on the measured routes
and says how many were measured and how large the others' estimates are; it never says "yes"
while an unmeasured route's estimate lies outside ±5%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from probes.ablation.ranking import rank_heads
from probes.patching.sweep import logit_diff
from probes.routes.moving import MovedOutputs

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["MovedOnce", "Screen", "route_estimates", "screened_heads"]


@dataclass(frozen=True)
class Screen:
    """Route shares screened by attribution (module docstring): every head's share estimated at
    once, along ``path`` ("clean": the derivative with every route live, one point; "joint":
    integrated over ``steps`` Gauss-Legendre nodes of the joint path), and the ``k`` largest
    measured exactly. ``route_shares(screen=k)`` is ``Screen(k)``."""

    k: int
    path: str = "clean"
    steps: int = 1

    def __post_init__(self) -> None:
        for name, value in (("k", self.k), ("steps", self.steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Screen: {name} must be a positive integer, got {value!r}")
        if self.path not in ("clean", "joint") or (self.path == "clean" and self.steps != 1):
            raise ValueError(
                f"Screen: path must be 'clean' (steps 1) or 'joint', got {self.path!r} with "
                f"{self.steps} steps"
            )

    @classmethod
    def of(cls, screen: Screen | int | None) -> Screen | None:
        """A screen object, or the one an int (``k``) names; None measures every route."""
        if screen is None or isinstance(screen, Screen):
            return screen
        return cls(screen)


class MovedOnce:
    """:class:`MovedOutputs` of every pair computed once (full width, in chunks of ``rows``) and
    served to every later chunk (a :class:`probes.common.replace.Replacement`). A chunk cut to fewer
    columns reads the first columns: the real tokens' outputs do not depend on the pads after
    them (causal attention, or pads masked as keys)."""

    method = "positions moved"

    def __init__(self, moved: MovedOutputs, rows: int) -> None:
        self.names = moved.names
        n, width = moved.tokens.shape
        parts: dict[str, list[Tensor]] = {name: [] for name in self.names}
        for c0 in range(0, n, rows):
            idx = torch.arange(c0, min(n, c0 + rows), device=moved.tokens.device)
            for name, z in moved.for_chunk(idx, width).items():
                parts[name].append(z)
        self.z = {name: torch.cat(zs) for name, zs in parts.items() if zs}

    def for_chunk(self, idx: Tensor, width: int) -> dict[str, Tensor | None]:
        return {name: z[idx, :width] for name, z in self.z.items()}


def route_estimates(
    model: ProbeModel,
    clean: Tensor,
    mask: Tensor,
    good: Tensor,
    bad: Tensor,
    moved: MovedOnce,
    *,
    path: str = "clean",
    steps: int = 1,
    batch_size: int,
) -> np.ndarray:
    """``[n_layers, n_heads]``: each head's estimated mean ``ld(x) - ld(x; h sees σ)`` (module
    docstring; 0 where the head is not a route)."""

    def ld(logits: Tensor, i: Tensor) -> Tensor:  # the pair's labels by row index
        return logit_diff(logits, good[i], bad[i])

    rows = torch.arange(len(clean), device=clean.device)
    with torch.enable_grad():
        est = rank_heads(
            model,
            clean,
            rows,
            mask,
            surrogate=ld,
            steps=steps,
            path=path,
            batch_size=batch_size * steps,
            replace=moved,
        )
    return np.asarray(est["estimate"], dtype=np.float64)


def screened_heads(estimates: np.ndarray, routes: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The ``k`` route heads of largest ``|estimate|`` (ties in layer, head order), in layer order."""
    heads = [(int(a), int(h)) for a, h in zip(*np.nonzero(routes))]
    order = sorted(range(len(heads)), key=lambda i: -abs(float(estimates[heads[i]])))
    return sorted(heads[i] for i in order[:k])

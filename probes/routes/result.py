"""The result of :func:`probes.routes.shares.route_shares`: each positional route's share of the
model's positional effect, with its bootstrap interval, saved and loaded as the
``positional routes`` result kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.util.io import load_result, nan_array, register_result, to_json, write_result
from probes.routes.moving import EMBED

__all__ = ["RESULT_KIND", "RouteShares"]


RESULT_KIND = register_result(
    "positional routes", "RouteShares.load", ("shares", "routes", "effect")
)


@dataclass(frozen=True, eq=False)
class RouteShares:
    """What :func:`route_shares` returns. ``shares``/``ci_low``/``ci_high`` are ``[n_layers,
    n_heads]`` (0 for a head that is not a route); ``embed`` and its CI are None without an
    absolute encoding. ``effect`` is the positional effect (mean logit-difference change, with
    its CI), ``counterfactual_effect`` the same against the counterfactual input itself. A
    screened result (``route_shares(screen=k)``) has ``estimates``, every route head's share as
    attribution estimated it, and NaN shares (and intervals) for the route heads it did not
    measure exactly."""

    shares: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    routes: np.ndarray  # bool [n_layers, n_heads]
    embed: float | None
    embed_ci: tuple[float, float] | None
    effect: float
    effect_ci: tuple[float, float]
    counterfactual_effect: float
    identity_gap: float  # mean |ld(x; every route sees σ) - ld(x')| (0 for an order-blind model)
    n_examples: int
    n_bootstrap: int
    ci: float
    seed: int
    estimates: np.ndarray | None = None  # [n_layers, n_heads] (screened results only)

    @property
    def n_layers(self) -> int:
        return self.shares.shape[0]

    @property
    def screened(self) -> bool:
        return self.estimates is not None

    @property
    def measured(self) -> np.ndarray:
        """``[n_layers, n_heads]`` bool: the route heads whose share was measured exactly."""
        return self.routes & ~np.isnan(self.shares)

    def unmeasured_max(self) -> float:
        """The largest ``|estimated share|`` of a route head not measured (0 when none is)."""
        if self.estimates is None:
            return 0.0
        rest = self.routes & ~self.measured
        return float(np.abs(self.estimates[rest]).max()) if rest.any() else 0.0

    def units(self) -> list[tuple[str, float, float, float]]:
        """``(name, share, ci_low, ci_high)`` of every measured route (``L0H3``, ``embed``),
        largest first."""
        out = [
            (
                f"L{a}H{h}",
                float(self.shares[a, h]),
                float(self.ci_low[a, h]),
                float(self.ci_high[a, h]),
            )
            for a, h in zip(*np.nonzero(self.measured))
        ]
        if self.embed is not None:
            out.append((EMBED, self.embed, *self.embed_ci))
        return sorted(out, key=lambda u: -u[1])

    def to_dict(self) -> dict[str, Any]:
        return to_json(
            {
                "shares": self.shares,
                "ci_low": self.ci_low,
                "ci_high": self.ci_high,
                "routes": self.routes.astype(int),
                "embed": self.embed,
                "embed_ci": self.embed_ci,
                "effect": self.effect,
                "effect_ci": self.effect_ci,
                "counterfactual_effect": self.counterfactual_effect,
                "identity_gap": self.identity_gap,
                "n_examples": self.n_examples,
                "n_bootstrap": self.n_bootstrap,
                "ci": self.ci,
                "seed": self.seed,
                "estimates": self.estimates,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RouteShares:
        pair = lambda v: None if v is None else (float(v[0]), float(v[1]))  # noqa: E731
        return cls(
            nan_array(d["shares"]),
            nan_array(d["ci_low"]),
            nan_array(d["ci_high"]),
            np.asarray(d["routes"], dtype=bool),
            None if d["embed"] is None else float(d["embed"]),
            pair(d["embed_ci"]),
            float(d["effect"]),
            pair(d["effect_ci"]),
            float(d["counterfactual_effect"]),
            float(d["identity_gap"]),
            int(d["n_examples"]),
            int(d["n_bootstrap"]),
            float(d["ci"]),
            int(d["seed"]),
            None if d.get("estimates") is None else nan_array(d["estimates"]),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> RouteShares:
        return load_result(path, RESULT_KIND, cls.from_dict)

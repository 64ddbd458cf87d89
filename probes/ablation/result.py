"""What a head-ablation sweep returns (:func:`probes.ablation.ablate_heads`): :class:`AblationResult`,
which saves and loads itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.util.io import (
    load_result,
    nan_array,
    register_result,
    to_json,
    write_result,
)
from probes.common.inputs import (
    check_layer,
)
from probes.common.replace import METHODS

Head = tuple[int, int]


# ------------------------------------------------------------------------------------------------
# Result
# ------------------------------------------------------------------------------------------------
RESULT_KIND = register_result(
    "ablation",
    "AblationResult.load",
    ("baseline", "values", "drops", "method", "metric", "n_layers", "n_heads"),
)


@dataclass(frozen=True, eq=False)
class AblationResult:
    """The outcome of :func:`probes.ablation.ablate_heads`.

    For a grid sweep (``head_sets is None``) the arrays are ``[n_layers, n_heads]``: entry
    ``[l, h]`` is the metric with head ``h`` of layer ``l`` ablated, NaN where not computed. For
    a set sweep they are ``[n_sets]``, one entry per ``head_sets[i]``.

    ``drops`` is the *harm* of each ablation, signed so that **positive always means the
    ablation hurt**: ``baseline - values`` for higher-is-better metrics (accuracy, true-class
    logit) and ``values - baseline`` for lower-is-better ones (loss). ``ci_low``/``ci_high``
    bound ``drops`` (paired percentile bootstrap over examples, see
    :func:`probes.common.metrics.paired_bootstrap`; NaN when ``n_bootstrap == 0``).
    ``per_example`` (``[..., n_examples]``, optional) holds the per-example metric under
    ablation and ``baseline_per_example`` the clean one.
    """

    baseline: float
    values: np.ndarray
    drops: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    method: str
    metric: str
    higher_is_better: bool
    n_examples: int
    n_layers: int
    n_heads: int
    head_sets: tuple[tuple[Head, ...], ...] | None = None
    per_example: np.ndarray | None = None
    baseline_per_example: np.ndarray | None = None
    n_bootstrap: int = 0
    ci: float = 0.95
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_grid(self) -> bool:
        return self.head_sets is None

    @property
    def computed(self) -> np.ndarray:
        """Boolean mask of the entries that were computed."""
        return ~np.isnan(self.values)

    def layer(self, layer: int) -> np.ndarray:
        """The drops of one layer's heads (grid sweeps only)."""
        self._need_grid()
        return self.drops[check_layer(self.n_layers, layer, "AblationResult")]

    def top_head(self, layer: int) -> int:
        """The head whose ablation hurts most in ``layer`` (grid sweeps only)."""
        d = self.layer(layer)
        if np.isnan(d).all():
            raise ValueError(f"layer {layer} was not swept")
        return int(np.nanargmax(d))

    def _need_grid(self) -> None:
        if not self.is_grid:
            raise ValueError("this AblationResult holds head sets, not a layers x heads grid")

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self, per_example: bool = True) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes null). ``per_example=False`` leaves out the per-example
        arrays, which can be large."""
        return {
            "baseline": self.baseline,
            "values": to_json(self.values),
            "drops": to_json(self.drops),
            "ci_low": to_json(self.ci_low),
            "ci_high": to_json(self.ci_high),
            "method": self.method,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "n_examples": self.n_examples,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "head_sets": None
            if self.head_sets is None
            else [[list(h) for h in s] for s in self.head_sets],
            "per_example": to_json(self.per_example) if per_example else None,
            "baseline_per_example": to_json(self.baseline_per_example) if per_example else None,
            "n_bootstrap": self.n_bootstrap,
            "ci": self.ci,
            "seed": self.seed,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AblationResult:
        sets = d.get("head_sets")
        return cls(
            baseline=float(d["baseline"]),
            values=nan_array(d["values"]),
            drops=nan_array(d["drops"]),
            ci_low=nan_array(d["ci_low"]),
            ci_high=nan_array(d["ci_high"]),
            method=d["method"],
            metric=d["metric"],
            higher_is_better=bool(d["higher_is_better"]),
            n_examples=int(d["n_examples"]),
            n_layers=int(d["n_layers"]),
            n_heads=int(d["n_heads"]),
            head_sets=None
            if sets is None
            else tuple(tuple((int(a), int(b)) for a, b in s) for s in sets),
            per_example=nan_array(d.get("per_example")),
            baseline_per_example=nan_array(d.get("baseline_per_example")),
            n_bootstrap=int(d.get("n_bootstrap", 0)),
            ci=float(d.get("ci", 0.95)),
            seed=int(d.get("seed", 0)),
            meta=dict(d.get("meta", {})),
        )

    def save(self, path: str | Path, per_example: bool = False) -> Path:
        return write_result(
            path, RESULT_KIND, self.to_dict(per_example=per_example), indent=1, sort_keys=False
        )

    @classmethod
    def load(cls, path: str | Path) -> AblationResult:
        return load_result(path, RESULT_KIND, cls.from_dict)


def verification_summary(heads: list, estimate: list[float], exact: list[float]) -> dict[str, Any]:
    """What a cheaper engine's verification saw: the estimates of the verified heads against their
    exact drops (largest error, whether the estimated top is the exact top, Spearman's rho from 3)."""
    from probes.circuits.agreement import spearman

    return {
        "heads": [list(h) for h in heads],
        "estimate": estimate,
        "exact": exact,
        "max_abs_error": max(abs(a - b) for a, b in zip(estimate, exact)),
        "top_agrees": int(np.argmax(estimate)) == int(np.argmax(exact)),
        "spearman": spearman(estimate, exact) if len(heads) >= 3 else float("nan"),
    }


__all__ = ["METHODS", "AblationResult", "Head", "verification_summary"]

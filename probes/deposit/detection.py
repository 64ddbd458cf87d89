"""Layer concentration in an ablation sweep.

:func:`find_deposits` reads an :class:`~probes.ablation.AblationResult` layer by layer and flags
a **layer concentration** where one head carries most of what *its layer* contributes (the
per-layer line plots by which the paper judged its "deposit pattern", digest §6). A layer
concentration is weaker than a **single-head deposit**, which is a property of the whole model
(:func:`probes.deposit.dominance`: one head ≥ 50 points, every other within 5): a model can
have a concentrated layer and still several heads that matter. Thresholds are compared at the
evaluation set's granularity, and an exact tie for a layer's top is never flagged.
:func:`layer_stats` is the one definition of a layer's deposit statistics (top head, runner-up,
margin, share, entropy, Gini), used by detection, by the dynamics callback, by the report and by
the claims.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.util.io import (
    load_result,
    nan_float,
    register_result,
    to_json,
    write_result,
)
from probes.ablation import AblationResult, Head
from probes.common.inputs import check_fraction, check_layers, check_threshold
from probes.deposit.dominance import GRANULE_TOL, at_least

DEFAULT_MIN_DROP_ACCURACY = 0.2
DEFAULT_MIN_SHARE = 0.5


# ------------------------------------------------------------------------------------------------
# Concentration of one layer's drops
# ------------------------------------------------------------------------------------------------
def normalized_entropy(x: np.ndarray) -> float:
    """Entropy of ``x / x.sum()`` divided by ``log(len(x))``: 0 when one entry holds everything,
    1 when all are equal. ``x`` must be non-negative; NaN when it sums to 0 or has < 2 entries."""
    x = np.asarray(x, dtype=np.float64)
    s = x.sum()
    if len(x) < 2 or s <= 0:
        return float("nan")
    p = x[x > 0] / s
    return float(-(p * np.log(p)).sum() / math.log(len(x))) + 0.0  # no -0.0


def normalized_gini(x: np.ndarray) -> float:
    """Gini coefficient of non-negative ``x``, scaled by ``n / (n - 1)`` so that one non-zero
    entry gives 1 and equal entries give 0. NaN when ``x`` sums to 0 or has < 2 entries."""
    x = np.asarray(x, dtype=np.float64)
    n, s = len(x), x.sum()
    if n < 2 or s <= 0:
        return float("nan")
    g = np.abs(x[:, None] - x[None, :]).sum() / (2.0 * n * s)
    return float(g * n / (n - 1))


@dataclass(frozen=True)
class LayerDeposit:
    """One layer's verdict (see :func:`find_deposits`); drops are positive when ablation hurt."""

    layer: int
    top_head: int
    top_drop: float
    top_ci: tuple[float, float]  # NaN when the sweep had no bootstrap
    second_head: int | None
    second_drop: float
    margin: float  # top_drop - second_drop
    share: float  # top head's share of the layer's summed positive drops
    entropy: float  # normalised entropy of the positive drops (0 = one head, 1 = uniform)
    gini: float  # normalised Gini of the positive drops (1 = one head, 0 = uniform)
    ci_separated: bool | None  # top CI's lower bound > second head's drop (None: no CI)
    is_deposit: bool  # the layer is concentrated (the files' name; see ``is_concentrated``)
    failed: tuple[str, ...] = ()  # the criteria that were not met

    @property
    def head(self) -> Head:
        return (self.layer, self.top_head)

    @property
    def is_concentrated(self) -> bool:
        """The layer is concentrated in its top head (``is_deposit``, its name in the files)."""
        return self.is_deposit

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "top_head": self.top_head,
            "top_drop": to_json(self.top_drop),
            "top_ci": [to_json(self.top_ci[0]), to_json(self.top_ci[1])],
            "second_head": self.second_head,
            "second_drop": to_json(self.second_drop),
            "margin": to_json(self.margin),
            "share": to_json(self.share),
            "entropy": to_json(self.entropy),
            "gini": to_json(self.gini),
            "ci_separated": self.ci_separated,
            "is_deposit": self.is_deposit,
            "failed": list(self.failed),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerDeposit:
        return cls(
            layer=int(d["layer"]),
            top_head=int(d["top_head"]),
            top_drop=nan_float(d["top_drop"]),
            top_ci=(nan_float(d["top_ci"][0]), nan_float(d["top_ci"][1])),
            second_head=d["second_head"],
            second_drop=nan_float(d["second_drop"]),
            margin=nan_float(d["margin"]),
            share=nan_float(d["share"]),
            entropy=nan_float(d["entropy"]),
            gini=nan_float(d["gini"]),
            ci_separated=d["ci_separated"],
            is_deposit=bool(d["is_deposit"]),
            failed=tuple(d.get("failed", ())),
        )


def layer_stats(
    drops: np.ndarray,
    ci_low: np.ndarray | None = None,
    ci_high: np.ndarray | None = None,
    *,
    layer: int = 0,
    min_drop: float = DEFAULT_MIN_DROP_ACCURACY,
    min_share: float = DEFAULT_MIN_SHARE,
    require_separation: bool = True,
) -> LayerDeposit | None:
    """The :class:`LayerDeposit` of one layer's per-head drops (NaN = head not swept)."""
    drops = np.asarray(drops, dtype=np.float64)
    heads = np.flatnonzero(~np.isnan(drops))
    if len(heads) == 0:
        return None
    d = drops[heads]
    order = np.argsort(-d, kind="stable")
    top = int(heads[order[0]])
    top_drop = float(d[order[0]])
    second = int(heads[order[1]]) if len(heads) > 1 else None
    second_drop = float(d[order[1]]) if len(heads) > 1 else float("nan")
    pos = np.clip(d, 0.0, None)
    total = pos.sum()
    share = float(pos[order[0]] / total) if total > 0 else float("nan")
    lo = float(ci_low[top]) if ci_low is not None else float("nan")
    hi = float(ci_high[top]) if ci_high is not None else float("nan")
    separated = None if (math.isnan(lo) or second is None) else bool(lo > second_drop)
    failed = []
    if not at_least(top_drop, min_drop) or not top_drop > GRANULE_TOL:
        failed.append(f"top drop {top_drop:.3g} < min_drop {min_drop:.3g}")
    if math.isnan(share):
        failed.append("no head of the layer hurts when ablated (every drop <= 0): no share to take")
    elif not at_least(share, min_share):
        failed.append(f"share {share:.3g} < min_share {min_share:.3g}")
    if second is not None and not top_drop - second_drop > GRANULE_TOL:
        failed.append(f"tie: head {second} drops as much as head {top}")
    if require_separation and separated is False:
        failed.append(
            f"CI low {lo:.3g} of the top head does not exceed the second head's drop {second_drop:.3g}"
        )
    return LayerDeposit(
        layer=layer,
        top_head=top,
        top_drop=top_drop,
        top_ci=(lo, hi),
        second_head=second,
        second_drop=second_drop,
        margin=top_drop - second_drop,
        share=share,
        entropy=normalized_entropy(pos),
        gini=normalized_gini(pos),
        ci_separated=separated,
        is_deposit=not failed,
        failed=tuple(failed),
    )


RESULT_KIND = register_result("deposit", "DepositReport.load", ("deposits", "layers", "thresholds"))


@dataclass(frozen=True)
class DepositReport:
    """Per-layer deposit verdicts of one ablation sweep (see :func:`find_deposits`)."""

    layers: tuple[LayerDeposit, ...]
    deposits: tuple[Head, ...]
    metric: str
    method: str
    baseline: float
    min_drop: float
    min_share: float
    require_separation: bool

    @property
    def concentrated(self) -> tuple[Head, ...]:
        """The top heads of the concentrated layers (``deposits``, its name in the files)."""
        return self.deposits

    def layer(self, layer: int) -> LayerDeposit:
        for s in self.layers:
            if s.layer == layer:
                return s
        raise ValueError(
            f"layer {layer} is not in this report; it has layers {[s.layer for s in self.layers]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "deposits": [list(h) for h in self.deposits],
            "layers": [s.to_dict() for s in self.layers],
            "metric": self.metric,
            "method": self.method,
            "baseline": self.baseline,
            "thresholds": {
                "min_drop": self.min_drop,
                "min_share": self.min_share,
                "require_separation": self.require_separation,
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DepositReport:
        t = d["thresholds"]
        return cls(
            layers=tuple(LayerDeposit.from_dict(s) for s in d["layers"]),
            deposits=tuple((int(a), int(b)) for a, b in d["deposits"]),
            metric=d["metric"],
            method=d["method"],
            baseline=float(d["baseline"]),
            min_drop=float(t["min_drop"]),
            min_share=float(t["min_share"]),
            require_separation=bool(t["require_separation"]),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=1, sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> DepositReport:
        return load_result(path, RESULT_KIND, cls.from_dict)

    @property
    def first(self) -> Head | None:
        """The flagged head of the shallowest flagged layer, None when nothing is flagged."""
        return min(self.deposits) if self.deposits else None

    def summary(self) -> str:
        """A short fixed-width table, one row per layer."""
        rows = [
            f"{self.method}-ablation, metric {self.metric}, baseline {self.baseline:.4f}",
            f"{'layer':>5} {'head':>4} {'drop':>8} {'CI':>19} {'2nd':>8} {'share':>6} {'entropy':>7} concentrated",
        ]
        for s in self.layers:
            ci = "" if math.isnan(s.top_ci[0]) else f"[{s.top_ci[0]:.3f}, {s.top_ci[1]:.3f}]"
            rows.append(
                f"{s.layer:>5} {s.top_head:>4} {s.top_drop:>8.4f} {ci:>19} {s.second_drop:>8.4f} "
                f"{s.share:>6.2f} {s.entropy:>7.2f} {'YES' if s.is_deposit else 'no'}"
            )
        return "\n".join(rows)


def find_deposits(
    result: AblationResult,
    *,
    min_drop: float | None = None,
    min_share: float = DEFAULT_MIN_SHARE,
    require_separation: bool = True,
    layers: Iterable[int] | None = None,
) -> DepositReport:
    """Flag the layers where a single head carries the layer's contribution.

    A layer's top head (largest drop) is flagged when all of these hold:

    1. **Large**: ``top_drop >= min_drop``. Default for ``metric="accuracy"``: **0.2** (20
       accuracy points). The paper reports a ~60-point drop from its deposit head; a third of
       that still counts as a (weaker) deposit, while 20 points is far above the sampling noise
       of held-out sets of a few thousand examples (standard error of a paired accuracy
       difference ~1 point) and above what single heads cost in models that spread their work
       (a few points). A model at chance cannot lose 20 points, so failed models are never
       flagged. For other metrics (loss, logit, callables) the units differ and there is no
       universal scale: the default is then 0 (only criteria 2-3 apply); pass a value.
    2. **Dominant**: ``share >= min_share`` (default **0.5**), where ``share`` is the top head's
       drop over the sum of the layer's positive drops: the top head hurts more than all other
       heads of the layer together. The paper's "others negligible" pattern has a share near 1;
       0.5 is the weakest level at which one head is still the majority.
    3. **Separated** (``require_separation``): the lower end of the top head's bootstrap CI is
       above the second head's drop, so the ranking is not sampling noise. Skipped (reported
       as ``ci_separated=None``) when the sweep had no bootstrap.

    Each layer also reports the margin (first minus second drop), the normalised entropy and
    Gini of its positive drops and the criteria that failed. Works on grid sweeps only, and
    refuses a partial grid (a layer with some heads not ablated, as
    ``ablate_heads(engine="attribution")`` leaves it), whose shares would be overstated; layers
    not swept at all are skipped.
    """
    check_fraction(min_share, "min_share", "find_deposits")
    if min_drop is not None:
        check_threshold(min_drop, "min_drop", "find_deposits")
    check_layers(result.n_layers, layers, "find_deposits")
    if not result.is_grid:
        raise ValueError("find_deposits needs a layers x heads sweep, not head sets")
    if min_drop is None:
        min_drop = DEFAULT_MIN_DROP_ACCURACY if result.metric == "accuracy" else 0.0
    wanted = range(result.n_layers) if layers is None else sorted(set(layers))
    for layer in wanted:
        done = int((~np.isnan(result.drops[layer])).sum())
        if 0 < done < result.n_heads:
            raise ValueError(
                f"find_deposits: layer {layer} has {done} of {result.n_heads} heads ablated (a partial grid"
                f"{', engine=attribution' if result.meta.get('engine') == 'attribution' else ''}); a layer's share "
                "needs every head's drop: ablate the whole layer (engine='exact')"
            )
    stats = []
    for layer in wanted:
        s = layer_stats(
            result.drops[layer],
            result.ci_low[layer],
            result.ci_high[layer],
            layer=layer,
            min_drop=min_drop,
            min_share=min_share,
            require_separation=require_separation,
        )
        if s is not None:
            stats.append(s)
    return DepositReport(
        layers=tuple(stats),
        deposits=tuple(s.head for s in stats if s.is_deposit),
        metric=result.metric,
        method=result.method,
        baseline=result.baseline,
        min_drop=float(min_drop),
        min_share=float(min_share),
        require_separation=bool(require_separation),
    )


# What they find, said in the one vocabulary (issue 21): a layer concentration, not a single-head
# deposit. The older names stay, as the same objects, for the code and files written with them.
find_concentrations = find_deposits
ConcentrationReport = DepositReport
LayerConcentration = LayerDeposit

__all__ = [
    "DEFAULT_MIN_DROP_ACCURACY",
    "DEFAULT_MIN_SHARE",
    "ConcentrationReport",
    "DepositReport",
    "LayerConcentration",
    "LayerDeposit",
    "find_concentrations",
    "find_deposits",
    "layer_stats",
    "normalized_entropy",
    "normalized_gini",
]

"""Per-example metrics for ablation sweeps, the one bootstrap over examples (ablation and
patching both use :func:`bootstrap_ci`), and the seeded resample sources.

Every metric maps class logits ``[batch, n_classes]`` and labels ``[batch]`` to one number per
example; a sweep's score is the mean over examples. Built-ins:

========== ===================================== =================
name       per example                           direction
========== ===================================== =================
accuracy   1.0 if ``argmax(logits) == label``    higher is better
loss       cross-entropy of the true class       lower is better
logit      the true class's logit                higher is better
========== ===================================== =================

A user callable ``metric(logits, labels) -> Tensor[batch]`` is higher-is-better unless the sweep
is told otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from probes.common.inputs import check_count

MetricFn = Callable[[Tensor, Tensor], Tensor]


def accuracy_per_example(logits: Tensor, labels: Tensor) -> Tensor:
    return (logits.argmax(-1) == labels).to(torch.float64)


def loss_per_example(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="none").to(torch.float64)


def logit_per_example(logits: Tensor, labels: Tensor) -> Tensor:
    return logits.gather(1, labels[:, None])[:, 0].to(torch.float64)


@dataclass(frozen=True)
class Metric:
    """A named per-example metric and its direction."""

    name: str
    fn: MetricFn
    higher_is_better: bool = True

    def __call__(self, logits: Tensor, labels: Tensor) -> Tensor:
        out = self.fn(logits, labels)
        if not isinstance(out, Tensor) or out.shape != labels.shape:
            raise ValueError(
                f"metric {self.name!r} must return a tensor of shape {tuple(labels.shape)} "
                f"(one value per example), got {getattr(out, 'shape', type(out))}"
            )
        return out.detach().to(torch.float64)


METRICS: dict[str, Metric] = {
    "accuracy": Metric("accuracy", accuracy_per_example, True),
    "loss": Metric("loss", loss_per_example, False),
    "logit": Metric("logit", logit_per_example, True),
}


def resolve_metric(metric: str | MetricFn | Metric, higher_is_better: bool | None = None) -> Metric:
    """A :class:`Metric` from a built-in name, a :class:`Metric`, or a callable."""
    if isinstance(metric, Metric):
        m = metric
    elif isinstance(metric, str):
        if metric not in METRICS:
            raise ValueError(
                f"unknown metric {metric!r}; expected one of {', '.join(map(repr, METRICS))} or a callable"
            )
        m = METRICS[metric]
    elif callable(metric):
        name = getattr(metric, "__name__", type(metric).__name__)
        m = Metric(name, metric, True)
    else:
        raise ValueError(f"metric must be a name or a callable, got {metric!r}")
    if higher_is_better is not None and higher_is_better != m.higher_is_better:
        m = Metric(m.name, m.fn, bool(higher_is_better))
    return m


def harm(baseline: np.ndarray | float, ablated: np.ndarray | float, higher_is_better: bool):
    """The signed change that is positive when ablation hurt: ``baseline - ablated`` for a
    higher-is-better metric, ``ablated - baseline`` for a lower-is-better one (loss)."""
    diff = np.asarray(baseline) - np.asarray(ablated)
    return diff if higher_is_better else -diff


def min_bootstrap(ci: float = 0.95) -> int:
    """The fewest bootstrap replicates that give a ``ci`` percentile interval: each tail, a share
    ``(1 - ci) / 2`` of them, must hold at least one replicate (40 at 95%); fewer put both ends
    on the most extreme replicates, or between them, and the interval says nothing."""
    return math.ceil(2.0 / (1.0 - ci) - 1e-9)


def bootstrap_ci(
    values: np.ndarray | Tensor,
    denominator: np.ndarray | Tensor | None = None,
    *,
    n_bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    max_elements: int = 20_000_000,
) -> tuple[np.ndarray, np.ndarray]:
    """The one bootstrap of the probes: a percentile CI over examples.

    ``values`` is ``[..., n_examples]`` (per-example numbers); the statistic is their mean, or,
    with ``denominator [n_examples]``, the ratio ``mean(values) / mean(denominator)``, both
    recomputed on each replicate. Each replicate draws ``n_examples`` example indices with
    replacement from one seeded ``torch.Generator`` (so the result depends only on ``seed``), and
    every row of ``values`` uses the same replicates, so rows that are paired differences get
    the CI of a paired difference and different rows' CIs come from the same resamples. The
    interval is NumPy's (linear) percentiles at ``(1 - ci) / 2`` and ``(1 + ci) / 2``. Rows that
    contain NaN give NaN. Returns ``(low, high)`` of shape ``values.shape[:-1]`` (float64).
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")
    check_count(n_bootstrap, "n_bootstrap", 0)
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    values = np.asarray(values, dtype=np.float64)
    lead, n = values.shape[:-1], values.shape[-1]
    flat = values.reshape(-1, n)
    low = np.full(flat.shape[0], np.nan)
    high = np.full(flat.shape[0], np.nan)
    ok = ~np.isnan(flat).any(axis=1)
    if n_bootstrap <= 0 or n == 0 or not ok.any():
        return low.reshape(lead), high.reshape(lead)
    rows = torch.from_numpy(flat[ok].copy())  # [U, n]
    den = None
    if denominator is not None:
        if isinstance(denominator, Tensor):
            denominator = denominator.detach().cpu().double().numpy()
        den = torch.from_numpy(np.asarray(denominator, dtype=np.float64).reshape(n).copy())
    gen = torch.Generator().manual_seed(int(seed))
    per_chunk = max(1, max_elements // max(n, 1))
    reps = []
    for start in range(0, n_bootstrap, per_chunk):
        r = min(per_chunk, n_bootstrap - start)
        idx = torch.randint(n, (r, n), generator=gen)
        counts = torch.zeros(r, n, dtype=torch.float64).scatter_add_(
            1, idx, torch.ones(r, n, dtype=torch.float64)
        )
        sums = rows @ counts.T  # [U, r]: resampled sums
        reps.append(sums / n if den is None else sums / (counts @ den)[None, :])
    boot = torch.cat(reps, dim=1).numpy()
    alpha = (1.0 - ci) / 2.0
    low[ok] = np.quantile(boot, alpha, axis=1)
    high[ok] = np.quantile(boot, 1.0 - alpha, axis=1)
    return low.reshape(lead), high.reshape(lead)


def paired_bootstrap(
    baseline: np.ndarray,
    ablated: np.ndarray,
    *,
    higher_is_better: bool = True,
    n_bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    max_elements: int = 20_000_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of the mean harm (see :func:`harm`), resampling examples jointly:
    :func:`bootstrap_ci` of the per-example harm.

    ``baseline`` is ``[n_examples]`` and ``ablated`` ``[..., n_examples]`` (per-example metric
    values); the same replicates serve the baseline and every ablation, so the CI is that of a
    paired difference. Rows of ``ablated`` that are all NaN give NaN. Returns ``(low, high)``
    with the shape of ``ablated.shape[:-1]``.
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")
    ablated = np.asarray(ablated, dtype=np.float64)
    baseline = np.asarray(baseline, dtype=np.float64)
    n = ablated.shape[-1]
    if baseline.shape != (n,):
        raise ValueError(f"baseline must have shape ({n},), got {baseline.shape}")
    diff = harm(baseline, ablated, higher_is_better)
    return bootstrap_ci(diff, n_bootstrap=n_bootstrap, ci=ci, seed=seed, max_elements=max_elements)


def resample_sources(n_examples: int, n_reference: int | None, seed: int) -> Tensor:
    """Source row for each example in a resample ablation (see :mod:`probes.ablation`; the
    faithfulness of a circuit under ``ablation="resample"`` uses the same sources).

    ``n_reference=None`` means the reference is the evaluated set itself: a seeded random cyclic
    derangement (``src[perm[i]] = perm[i + 1]``), so no example is its own source."""
    gen = torch.Generator().manual_seed(int(seed))
    if n_reference is None:
        if n_examples < 2:
            raise ValueError("resample ablation needs at least 2 examples (or a reference set)")
        perm = torch.randperm(n_examples, generator=gen)
        src = torch.empty(n_examples, dtype=torch.long)
        src[perm] = perm.roll(-1)
        return src
    if n_reference < 1:
        raise ValueError("resample ablation: the reference set is empty")
    return torch.randint(n_reference, (n_examples,), generator=gen)


def logit_diff(logits: Tensor, good: Tensor, bad: Tensor) -> Tensor:
    """``logits[..., i, good_i] - logits[..., i, bad_i]`` per example (any leading dims)."""
    return logits.gather(-1, good[..., None]).squeeze(-1) - logits.gather(
        -1, bad[..., None]
    ).squeeze(-1)


def margin(logits: Tensor, good: Tensor) -> Tensor:
    """The label's logit minus the largest other logit per example (``logits [n, C]``): above 0
    exactly when the label is predicted."""
    own = logits.gather(1, good[:, None])[:, 0]
    return own - logits.scatter(1, good[:, None], float("-inf")).max(1).values


__all__ = [
    "logit_diff",
    "margin",
    "METRICS",
    "Metric",
    "MetricFn",
    "accuracy_per_example",
    "bootstrap_ci",
    "harm",
    "logit_per_example",
    "loss_per_example",
    "min_bootstrap",
    "paired_bootstrap",
    "resample_sources",
    "resolve_metric",
    "sign_test",
]


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a rate ``k`` of ``n`` (e.g. seeds that show a deposit): the
    interval of choice for small ``n`` and rates near 0 or 1 (it never leaves [0, 1] and is not
    degenerate at k = 0). ``(nan, nan)`` for ``n = 0``."""
    import statistics

    if not (isinstance(k, int) and isinstance(n, int) and 0 <= k <= n):
        raise ValueError(f"wilson needs integers 0 <= k <= n, got k={k!r}, n={n!r}")
    if not 0 < level < 1:
        raise ValueError(f"wilson level must be in (0, 1), got {level!r}")
    if n == 0:
        return float("nan"), float("nan")
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if k == 0 else max(0.0, float(centre - half))  # exact at the ends (no 1e-17 residue)
    high = 1.0 if k == n else min(1.0, float(centre + half))
    return low, high


def sign_test(a: int, b: int) -> float:
    """The exact two-sided sign test (McNemar's exact test on a paired yes/no outcome): the
    probability, under "either way is equally likely", of a split of the ``a + b`` discordant
    pairs at least as lopsided as ``a`` against ``b``. 1.0 when there is no discordant pair."""
    import math
    import numbers

    if not all(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= 0 for x in (a, b)
    ):
        raise ValueError(f"sign_test needs counts a, b >= 0, got a={a!r}, b={b!r}")
    a, b = int(a), int(b)
    n = a + b
    tail = sum(math.comb(n, i) for i in range(min(a, b) + 1)) / 2**n
    return min(1.0, 2 * tail)

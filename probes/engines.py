"""The two cheaper engines of :func:`probes.ablate_heads`, both ending in exact ablation of the
heads they rank first (``verify_top``):

- ``"sampled"``: the exact grid on a seeded random share ``sample`` of the examples, then the
  ``verify_top`` heads with the largest drops there ablated exactly on every example. Each drop
  is a paired difference on the examples it was measured on, so a head's sampled drop is an
  unbiased estimate of its drop on all of them, with a bootstrap interval over the sample; what
  it loses is sampling precision, which the interval states. Cost: ``sample`` of the grid plus
  ``verify_top`` single ablations.
- ``"attribution"``: integrated gradients along the ablation path
  (:func:`probes.circuits.heads.rank_heads`) rank every head; only the verified heads get a value.

``benchmarks/head_ranking.py`` measures both against the exact grid, with the exact grid's own
split-half agreement as the ceiling any estimate can reach.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from probes.ablation_parts import _as_inputs, _checked, _prepare, _units
from probes.ablation_result import METHODS, AblationResult
from probes.ablation_sweep import _run, _sweep_batched
from probes.metrics import resolve_metric


def _agreement(heads: list, estimate: list[float], exact: list[float]) -> dict[str, Any]:
    """What verification saw: the estimates of the verified heads against their exact drops."""
    from probes.circuits.agreement import spearman

    return {"heads": [list(h) for h in heads], "estimate": estimate, "exact": exact,
            "max_abs_error": max(abs(a - b) for a, b in zip(estimate, exact)),
            "top_agrees": int(np.argmax(estimate)) == int(np.argmax(exact)),
            "spearman": spearman(estimate, exact) if len(heads) >= 3 else float("nan")}  # fmt: skip


def _check_verify(verify_top: Any) -> None:
    if not isinstance(verify_top, int) or isinstance(verify_top, bool) or verify_top < 1:
        raise ValueError(f"verify_top must be a positive integer, got {verify_top!r}")


def _exact_of(model, tokens, labels, order, *, pad_mask, method, metric, reference, seed, **kwargs) -> AblationResult:
    """The heads of ``order`` ablated exactly, one at a time, on every example."""
    return _run(_sweep_batched, model, tokens, labels, pad_mask=pad_mask, method=method, metric=metric, layers=None,
                heads=None, head_sets=[(h,) for h in order], reference=reference, seed=seed, **kwargs)  # fmt: skip


def sampled_engine(model, tokens, labels, *, pad_mask, method, metric, layers, heads, reference, verify_top, seed,
                   sample, per_example, **kwargs) -> AblationResult:  # fmt: skip
    """``engine="sampled"`` of :func:`probes.ablate_heads` (module docstring).

    Returns the whole grid: the verified heads' values on every example, the others' sampled drops
    (``values`` there are the full baseline less that drop, so ``drops`` stays ``harm(baseline,
    values)``) with their intervals over the sample. ``per_example`` holds the sampled heads'
    values at the sampled examples (NaN at the others). ``meta``: ``"sample"`` (the share),
    ``"n_sample"``, ``"sample_indices"``, ``"verified"`` and ``"verification"`` (sampled against
    exact drops of the verified heads)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(map(repr, METHODS))}")
    _check_verify(verify_top)
    if isinstance(sample, bool) or not isinstance(sample, int | float) or not 0 < sample <= 1:
        raise ValueError(f"sample must be a share of the examples in (0, 1], got {sample!r}")
    units, _ = _units(model, layers, heads, None)
    tokens, labels, pad_mask = _checked(model, tokens, labels, pad_mask, kwargs.get("n_bootstrap", 0), reference,
                                        "ablate_heads")  # fmt: skip
    n = len(tokens)
    k = min(n, max(2, math.ceil(sample * n)))
    gen = torch.Generator().manual_seed(int(seed))
    idx = torch.randperm(n, generator=gen)[:k].sort().values
    on = idx.to(tokens.device)
    # mean and resample take their values from the evaluated set, not from the sample (resample:
    # each sampled example draws its source from it uniformly, see probes.ablation)
    ref = (tokens, pad_mask) if reference is None and method != "zero" else reference
    screen = _run(_sweep_batched, model, tokens[on], labels[on], pad_mask=pad_mask[on], method=method, metric=metric,
                  layers=layers, heads=heads, head_sets=None, reference=ref, seed=seed, per_example=per_example,
                  **kwargs)  # fmt: skip
    heads_ = [u[0] for u in units]
    order = sorted(heads_, key=lambda h: -screen.drops[h])[: min(verify_top, len(heads_))]
    exact = _exact_of(model, tokens, labels, order, pad_mask=pad_mask, method=method, metric=metric,
                      reference=reference, seed=seed, per_example=per_example, **kwargs)  # fmt: skip
    m = resolve_metric(metric, kwargs.get("higher_is_better"))
    drops, low, high = screen.drops.copy(), screen.ci_low.copy(), screen.ci_high.copy()
    for i, h in enumerate(order):
        drops[h], low[h], high[h] = exact.drops[i], exact.ci_low[i], exact.ci_high[i]
    sign = 1.0 if m.higher_is_better else -1.0
    values = exact.baseline - sign * drops  # drops == harm(baseline, values)
    pe = None
    if per_example:
        pe = np.full(drops.shape + (n,), np.nan)
        pe[..., idx.numpy()] = screen.per_example
        for i, h in enumerate(order):
            pe[h] = exact.per_example[i]
    verification = _agreement(order, [float(screen.drops[h]) for h in order], [float(d) for d in exact.drops])
    meta = {**exact.meta, "engine": "sampled", "sample": float(sample), "n_sample": k,
            "sample_indices": idx.tolist(), "verified": verification["heads"], "verification": verification}  # fmt: skip
    return dataclasses.replace(exact, values=values, drops=drops, ci_low=low, ci_high=high, per_example=pe,
                               head_sets=None, meta=meta)  # fmt: skip


def attribution_engine(model, tokens, labels, *, pad_mask, method, metric, layers, heads, reference, verify_top,
                       seed, steps, path, **kwargs) -> AblationResult:  # fmt: skip
    """``engine="attribution"`` of :func:`probes.ablate_heads` (module docstring)."""
    from probes.circuits.heads import rank_heads

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(map(repr, METHODS))}")
    _check_verify(verify_top)
    units, _ = _units(model, layers, heads, None)
    tokens, labels, pad_mask = _checked(model, tokens, labels, pad_mask, kwargs.get("n_bootstrap", 0), reference,
                                        "ablate_heads")  # fmt: skip
    m = resolve_metric(metric, kwargs.get("higher_is_better"))
    if m.name in ("accuracy", "loss", "logit"):
        stand_in: Any = m.name
    else:  # a callable: integrate it itself (higher is better unless told otherwise)
        sign = 1.0 if m.higher_is_better else -1.0
        stand_in = lambda logits, lab: sign * m.fn(logits, lab)  # noqa: E731
    ref = None
    if reference is not None:
        rt, rp = _as_inputs(reference)
        ref = _prepare(model, rt, rp, "reference", "ablate_heads")
    est = rank_heads(model, tokens, labels, pad_mask, method=method, reference=ref, seed=seed, surrogate=stand_in,
                     steps=steps, path=path, batch_size=kwargs.get("batch_size"))  # fmt: skip
    grid, tie = est["estimate"], est["tiebreak"]
    order = [u[0] for u in sorted(units, key=lambda u: (-grid[u[0]], -tie[u[0]]))[:verify_top]]
    exact = _exact_of(model, tokens, labels, order, pad_mask=pad_mask, method=method, metric=metric,
                      reference=reference, seed=seed, **kwargs)  # fmt: skip
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def place(x: np.ndarray | None) -> np.ndarray | None:
        if x is None:
            return None
        out = np.full((L, H) + x.shape[1:], np.nan)
        for i, (layer, h) in enumerate(order):
            out[layer, h] = x[i]
        return out

    verification = _agreement(order, [float(grid[h]) for h in order], [float(v) for v in exact.drops])
    meta = {**exact.meta, "engine": "attribution", "stand_in": m.name if isinstance(stand_in, str) else f"{m.name} (itself)",
            "steps": steps, "path": path, "attribution": grid.tolist(), "tiebreak": tie.tolist(), "verified": verification["heads"],
            "verification": verification}  # fmt: skip
    return dataclasses.replace(
        exact, values=place(exact.values), drops=place(exact.drops), ci_low=place(exact.ci_low),
        ci_high=place(exact.ci_high), per_example=place(exact.per_example), head_sets=None, meta=meta,
    )  # fmt: skip


__all__ = ["attribution_engine", "sampled_engine"]

"""How well estimates rank like exact effects: Spearman's correlation (pandas' average ranks for
ties) and top-k agreement, over the entries both define."""

from __future__ import annotations

import numpy as np
import pandas as pd


def spearman(a, b) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` over the entries where neither is NaN
    (NaN when fewer than 3 remain or one side is constant)."""
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 3:
        return float("nan")
    ra, rb = pd.Series(a[ok]).rank().to_numpy(), pd.Series(b[ok]).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def top_k(a, b, k: int) -> float:
    """The share of the ``k`` largest entries of ``b`` that are among the ``k`` largest of ``a``
    (NaN entries never count)."""
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    ok = np.flatnonzero(~(np.isnan(a) | np.isnan(b)))
    k = min(k, len(ok))
    if k == 0:
        return float("nan")
    ta = set(ok[np.argsort(-a[ok], kind="stable")[:k]])
    tb = set(ok[np.argsort(-b[ok], kind="stable")[:k]])
    return len(ta & tb) / k


def agreement(estimate, exact, k: int = 5, ranking=None) -> dict[str, float]:
    """``{"spearman": signed estimate vs exact, "spearman_abs": ranking (default |estimate|) vs
    |exact|, "top_k": top-k agreement of ranking and |exact|, "k", "n"}``."""
    estimate = np.asarray(estimate, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    rank = np.abs(estimate) if ranking is None else np.asarray(ranking, dtype=np.float64)
    n = int((~(np.isnan(estimate) | np.isnan(exact))).sum())
    return {
        "spearman": spearman(estimate, exact),
        "spearman_abs": spearman(rank, np.abs(exact)),
        "top_k": top_k(rank, np.abs(exact), k),
        "k": int(min(k, n)),
        "n": n,
    }


__all__ = ["agreement", "spearman", "top_k"]

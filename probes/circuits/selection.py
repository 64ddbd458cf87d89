"""Circuits: which edges to keep, so that every kept edge does work.

An edge's attribution score is its effect with everything upstream of it clean. A set of edges
ranked by magnitude alone can keep edges whose writer is reached by no kept edge from the
embedding (so it computes its corrupt value and the edge carries nothing) or whose reader
reaches the logits by no kept edge: a circuit of such edges recovers nothing. Here every circuit
is **connected**: each kept edge lies on a path of kept edges from the embedding to the logits
(:func:`prune` removes the others).

A **unit** is an edge ``writer -> reader`` (summed over positions), or, **position-aware**
(Haklay et al. 2025), an edge at one span of the examples (``Attribution.by_span``: the task's
``prefix``, ``trigger1``, ``between``, ``trigger2``, ``suffix``, ``padding``): a circuit may keep
an edge at one span and not at another. Connectivity is then resolved by span: a head's output
at a span depends on its query input at that span and on its key and value inputs at every span;
an MLP's on its input at the same span; the readout on every span.

Three orders (:func:`rank_edges`; a circuit of size ``n`` is the longest prefix of the order
whose pruned units number at most ``n``):

- ``"paths"`` (default): by each unit's **widest path** from the embedding to the logits, the
  largest over the paths through it of the smallest ``|score|`` on the path (dynamic programming
  over the layers). Every threshold keeps exactly the union of the paths whose every unit
  scores at least that much, so the circuits are nested and connected by construction.
- ``"greedy"`` (Hanna et al. 2024, "Have Faith in Faithfulness"): from the logits down, add the
  highest-scoring unit whose reader is already in the circuit; then prune.
- ``"top"``: ``|score|`` alone, not pruned (the unconnected baseline; what :func:`circuit` did
  before).

A unit's ranking value is ``|score|`` (``"atp*"``: the GradDrop magnitude), summed over the
families given (``{"position": ..., "content": ...}``) or one family's (``by``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from probes.circuits.circuit_record import Circuit, circuit_from_mask
from probes.circuits.graph import Graph, build_graph_from
from probes.circuits.paths import greedy_order, prune, widest_paths
from probes.circuits.scores import Attribution

SELECTIONS = ("paths", "greedy", "top")


# ---------------------------------------------------------------------------------------------
# the ranking: an order over units, and its circuits
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Ranking:
    """An order over the units of one model's graph (see the module docstring). ``circuit(n)``
    is the first ``n`` units, pruned (``"top"``: not pruned)."""

    graph: Graph
    order: np.ndarray  # flat indices into [readers, writers, spans], best first
    value: np.ndarray  # what ordered them, per unit of ``order``
    rank: np.ndarray  # [readers, writers, spans] ranking magnitude
    scores: dict[str, np.ndarray]  # family -> [readers, writers, spans] signed scores
    span_names: tuple[str, ...]  # () when not position-aware; every span, read or not
    select: str
    method: str = ""
    metric: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.order)

    @property
    def spans_read(self) -> tuple[str, ...]:
        """The spans that hold units (those where some unit scores anything)."""
        live = ~np.isnan(self.rank).all((0, 1))
        return tuple(n for n, ok in zip(self.span_names, live) if ok)

    @property
    def positional(self) -> bool:
        return bool(self.span_names)

    @property
    def n_spans(self) -> int:
        return max(1, len(self.span_names))

    def keep(self, n: int) -> np.ndarray:
        """``[readers, writers, spans]``: the first ``n`` units, pruned unless ``select="top"``."""
        if not 0 <= n <= self.total:
            raise ValueError(f"circuit size must be in 0..{self.total}, got {n}")
        keep = np.zeros(self.rank.size, dtype=bool)
        keep[self.order[:n]] = True
        keep = keep.reshape(self.rank.shape)
        return keep if self.select == "top" else prune(self.graph, keep)

    def prefix_for(self, n: int) -> int:
        """The longest prefix whose circuit has at most ``n`` units (pruning drops the units of a
        path until its last unit is in; kept sizes grow with the prefix)."""
        if not 0 <= n <= self.total:
            raise ValueError(f"circuit size must be in 0..{self.total}, got {n}")
        if self.select == "top":
            return n
        lo, hi = n, self.total  # keep(n) has at most n units
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.keep(mid).sum() <= n else (lo, mid - 1)
        return lo

    def size_at(self, threshold: float) -> int:
        """How many first units have a value of at least ``threshold``."""
        below = np.flatnonzero(self.value < threshold)
        return int(below[0]) if len(below) else self.total

    def reordered(self, select: str) -> Ranking:
        """The same units and ranks in the order of another ``select``."""
        units = ~np.isnan(self.rank)
        order, value = order_units(self.graph, self.rank, units, select)
        return Ranking(**{**self.__dict__, "order": order, "value": value, "select": select})

    def circuit(self, n: int) -> Circuit:
        """The circuit of the longest prefix with at most ``n`` units (:meth:`prefix_for`)."""
        return self.circuit_of(
            self.keep(self.prefix_for(n)), {"select": self.select, "top_n": int(n)}
        )

    def circuit_of(self, keep: np.ndarray, selection: dict[str, Any] | None = None) -> Circuit:
        """The :class:`Circuit` of a ``[readers, writers, spans]`` mask, edges in this order."""
        return circuit_from_mask(
            self.graph,
            keep,
            self.span_names,
            order=self.order,
            scores=self.scores,
            rank=self.rank,
            total=self.total,
            method=self.method,
            metric=self.metric,
            meta={
                "selection": {**(selection or {}), "by": self.meta.get("by")},
                **self.meta.get("attribution", {}),
            },
        )


def _families(scores: Attribution | Mapping[str, Attribution], who: str) -> dict[str, Attribution]:
    fams = {"score": scores} if isinstance(scores, Attribution) else dict(scores)
    if not fams:
        raise ValueError(f"{who}: no scores")
    first = next(iter(fams.values()))
    for name, a in fams.items():
        if not isinstance(a, Attribution) or a.granularity != "edge":
            raise ValueError(
                f"{who}: {name!r} must be an edge Attribution (attribute(..., granularity='edge'))"
            )
        if a.writers != first.writers or a.readers != first.readers:
            raise ValueError(f"{who}: {name!r} scores another graph than the others")
    return fams


def rank_edges(
    scores: Attribution | Mapping[str, Attribution],
    *,
    select: str = "paths",
    positional: bool = False,
    by: str | None = None,
) -> Ranking:
    """A :class:`Ranking` of the units of ``scores`` (one edge :class:`Attribution`, or one per
    counterfactual family). ``positional``: one unit per edge and span (the attributions need
    ``by_span``, from ``attribute(..., spans=...)``); spans where no unit scores anything in any
    family (no example has a position there, or the model never reads it, as a model that masks
    its pads) are not units. See the module docstring."""
    if select not in SELECTIONS:
        raise ValueError(
            f"select must be one of {', '.join(map(repr, SELECTIONS))}; got {select!r}"
        )
    fams = _families(scores, "rank_edges")
    if by is not None and by not in fams:
        raise ValueError(f"by={by!r} is not one of {', '.join(fams)}")
    first = next(iter(fams.values()))
    graph = build_graph_from(first)
    if positional:
        for name, a in fams.items():
            if a.by_span is None:
                raise ValueError(
                    f"positional circuits need scores per span: {name!r} has none (attribute(..., spans=task.spans(pairs.clean)))"
                )
            if a.span_names != first.span_names:
                raise ValueError(f"{name!r} has other spans than the others")
        sig = {k: np.asarray(a.by_span, dtype=np.float64) for k, a in fams.items()}
        if any(a.magnitude is not None for a in fams.values()):
            raise ValueError(
                "positional circuits rank by |score| per span; 'atp*' has no scores per span"
            )
        mag = {k: np.abs(v) for k, v in sig.items()}
        live = np.array(
            [
                any(np.nansum(np.abs(v[..., s])) > 0 for v in sig.values())
                for s in range(len(first.span_names))
            ]
        )
        names = first.span_names
    else:
        sig = {k: np.asarray(a.scores, dtype=np.float64)[..., None] for k, a in fams.items()}
        mag = {k: np.asarray(a.ranking, dtype=np.float64)[..., None] for k, a in fams.items()}
        live, names = np.ones(1, dtype=bool), ()
    rank = mag[by] if by else sum(np.nan_to_num(m, nan=0.0) for m in mag.values())
    units = graph.valid[..., None] & live[None, None, :]
    rank = np.where(units, rank, np.nan)
    order, value = order_units(graph, rank, units, select)
    return Ranking(
        graph=graph,
        order=order,
        value=value,
        rank=rank,
        scores=sig,
        span_names=names,
        select=select,
        method=first.method,
        metric=first.metric,
        meta={"by": by, "attribution": dict(first.meta), "families": list(fams)},
    )


def order_units(
    graph: Graph, rank: np.ndarray, units: np.ndarray, select: str
) -> tuple[np.ndarray, np.ndarray]:
    """The units (``units``, ``[readers, writers, spans]``) best first by ``select`` from their
    non-negative ``rank``: flat indices and the value that ordered each."""
    if select not in SELECTIONS:
        raise ValueError(
            f"select must be one of {', '.join(map(repr, SELECTIONS))}; got {select!r}"
        )
    rank = np.where(units, rank, np.nan)
    if select == "paths":
        value = widest_paths(graph, rank)
        flat = np.where(units, value, np.nan).ravel()
        # ties (a path's units share its bottleneck): by their own rank, then graph order
        idx = np.flatnonzero(units.ravel())
        order = idx[np.lexsort((-rank.ravel()[idx], -flat[idx]))]
        return order, flat[order]
    if select == "greedy":
        order = greedy_order(graph, np.nan_to_num(rank, nan=-np.inf), units)
        return order, rank.ravel()[order]
    idx = np.flatnonzero(units.ravel())
    order = idx[np.argsort(-rank.ravel()[idx], kind="stable")]
    return order, rank.ravel()[order]


def circuit(
    scores: Attribution | Mapping[str, Attribution],
    *,
    top_n: int | None = None,
    threshold: float | None = None,
    by: str | None = None,
    select: str = "paths",
    positional: bool = False,
) -> Circuit:
    """The first ``top_n`` units of :func:`rank_edges` (or those whose ranking value is at least
    ``threshold``: ``"paths"``' widest-path value, else ``|score|``), connected unless
    ``select="top"``. With one attribution per family (``{"position": ..., "content": ...}``)
    units rank by the sum of the families' rankings, or by family ``by``; each edge keeps every
    family's score."""
    if (top_n is None) == (threshold is None):
        raise ValueError("circuit: pass exactly one of top_n= and threshold=")
    r = rank_edges(scores, select=select, positional=positional, by=by)
    if top_n is not None:
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
            raise ValueError(f"circuit: top_n must be a non-negative integer, got {top_n!r}")
        n = min(top_n, r.total)
    else:
        n = int(r.keep(r.size_at(threshold)).sum())
    c = r.circuit(n)
    c.meta["selection"].update({"top_n": top_n, "threshold": threshold})
    return c


__all__ = [
    "SELECTIONS",
    "Circuit",
    "Ranking",
    "circuit",
    "circuit_from_mask",
    "order_units",
    "prune",
    "rank_edges",
    "widest_paths",
]


# ---- sizes and areas of faithfulness curves (probes.circuits.faithfulness) ------------------------------
def curve_area(kept: Sequence[float], recovered: Sequence[float], total: int) -> float:
    """The area under recovered against the kept share of the graph (trapezoids between the
    measured sizes, which should include 0 and the whole graph): 1 for a circuit that recovers
    everything with no edge, 0.5 for a straight line."""
    x = np.asarray(kept, dtype=np.float64) / max(1, total)
    y = np.asarray(recovered, dtype=np.float64)
    o = np.argsort(x, kind="stable")
    return float(np.trapezoid(y[o], x[o])) if len(x) > 1 else float("nan")


def default_sizes(total: int, points: int = 16) -> list[int]:
    """0, about ``points`` sizes spaced geometrically from 1, and the whole graph."""
    return sorted(
        {0, *np.unique(np.geomspace(1, max(1, total), points).astype(int)).tolist(), total}
    )

"""A circuit as a result: its kept nodes and edges (or units per span), their scores, its file.

:class:`Circuit` is what :func:`probes.circuits.selection.circuit` and a
:class:`~probes.circuits.selection.Ranking` return, saved and loaded as the ``circuit`` result
kind; :func:`circuit_from_mask` builds one from a keep mask over the graph's units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.util.io import load_result, nan_array, register_result, to_json, write_result
from probes.circuits.graph import Graph, node_layer

__all__ = ["RESULT_KIND", "Circuit", "circuit_from_mask"]


RESULT_KIND = register_result(
    "circuit", "Circuit.load", ("nodes", "edges", "scores", "ranking", "total_edges")
)


@dataclass(frozen=True, eq=False)
class Circuit:
    """A set of edges with their scores. ``scores[family]`` is ``[n_edges]`` (one family
    ``"score"`` for a single attribution); ``ranking`` is what selected them. Position-aware:
    ``spans[i]`` is the span at which edge ``i`` is kept (an edge can appear once per span) and
    ``span_names`` the examples' spans; ``total_edges`` counts the units of the whole graph
    (edges x spans read). ``faithfulness`` holds the measured faithfulness (``"kept"``: of this
    circuit) and, from :func:`probes.circuits.faithfulness.minimal_circuit`, the curve.
    ``kv_view``: the graph's view of grouped key/value heads (:mod:`probes.circuits.graph`),
    ``"ungrouped"`` where its k/v readers are per query head on a grouped model."""

    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    scores: dict[str, np.ndarray]
    ranking: np.ndarray
    n_layers: int
    n_heads: int
    total_edges: int
    method: str = ""
    metric: str = ""
    faithfulness: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    spans: tuple[str, ...] | None = None
    span_names: tuple[str, ...] = ()
    kv_view: str = "grouped"

    @property
    def positional(self) -> bool:
        return self.spans is not None

    def share(self, family: str = "position", against: str = "content") -> np.ndarray:
        """Per edge ``|family| / (|family| + |against|)`` (NaN where both are 0)."""
        a, b = np.abs(self.scores[family]), np.abs(self.scores[against])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(a + b > 0, a / (a + b), np.nan)

    def into(self, node: str) -> list[int]:
        """Indices of the edges whose reader belongs to ``node`` (``"L0H4"`` takes its q, k, v; in a
        grouped model its q only, and its key/value head ``"L0KV2"`` takes the k and v its group
        reads; in the ungrouped view the head takes its own k and v)."""
        return [i for i, (_, r) in enumerate(self.edges) if r == node or r.split(".")[0] == node]

    def label(self, i: int) -> str:
        """``"embed -> L0H3.k"``, with ``" @ trigger2"`` for a position-aware edge."""
        w, r = self.edges[i]
        return f"{w} -> {r}" + (f" @ {self.spans[i]}" if self.spans is not None else "")

    def keep_mask(self, graph: Graph) -> np.ndarray:
        """``[readers, writers, spans]`` (one span when not position-aware): True where kept."""
        names = self.span_names if self.positional else ("all",)
        keep = np.zeros((*graph.valid.shape, len(names)), dtype=bool)
        for i, (w, r) in enumerate(self.edges):
            keep[
                graph.reader_index(r),
                graph.writer_index(w),
                names.index(self.spans[i]) if self.positional else 0,
            ] = True
        return keep

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "edges": [list(e) for e in self.edges],
            "spans": None if self.spans is None else list(self.spans),
            "span_names": list(self.span_names),
            "scores": {k: to_json(v) for k, v in self.scores.items()},
            "ranking": to_json(self.ranking),
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "total_edges": self.total_edges,
            "method": self.method,
            "metric": self.metric,
            "faithfulness": to_json(self.faithfulness),
            "meta": to_json(self.meta),
            "kv_view": self.kv_view,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Circuit:
        spans = d.get("spans")
        return cls(
            tuple(d["nodes"]),
            tuple((a, b) for a, b in d["edges"]),
            {k: nan_array(v) for k, v in d["scores"].items()},
            nan_array(d["ranking"]),
            int(d["n_layers"]),
            int(d["n_heads"]),
            int(d["total_edges"]),
            d.get("method", ""),
            d.get("metric", ""),
            d.get("faithfulness"),
            dict(d.get("meta") or {}),
            None if spans is None else tuple(spans),
            tuple(d.get("span_names") or ()),
            d.get("kv_view", "grouped"),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=1, sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> Circuit:
        return load_result(path, RESULT_KIND, cls.from_dict)


def circuit_from_mask(
    graph: Graph,
    keep: np.ndarray,
    span_names: tuple[str, ...],
    *,
    order: np.ndarray | None = None,
    scores: dict[str, np.ndarray] | None = None,
    rank: np.ndarray | None = None,
    total: int = 0,
    method: str = "",
    metric: str = "",
    meta: dict[str, Any] | None = None,
) -> Circuit:
    """A :class:`Circuit` of the units where ``keep`` (``[readers, writers, spans]``), listed in
    ``order`` (flat indices; default graph order), with each family's score and the rank."""
    W, S = keep.shape[1], keep.shape[2]
    idx = (
        np.flatnonzero(keep.ravel())
        if order is None
        else order[np.flatnonzero(keep.ravel()[order])]
    )
    triples = [(int(i) // (W * S), (int(i) // S) % W, int(i) % S) for i in idx]
    edges = tuple((graph.writers[w], graph.readers[r]) for r, w, _ in triples)
    nodes = sorted(
        {w for w, _ in edges} | {r.split(".")[0] for _, r in edges},
        key=lambda x: (node_layer(x, graph.n_layers), x),
    )
    return Circuit(
        nodes=tuple(nodes),
        edges=edges,
        scores={k: np.array([v[t] for t in triples]) for k, v in (scores or {}).items()},
        ranking=np.array([rank[t] for t in triples])
        if rank is not None
        else np.full(len(triples), np.nan),
        n_layers=graph.n_layers,
        n_heads=graph.n_heads,
        total_edges=int(total),
        method=method,
        metric=metric,
        meta=dict(meta or {}),
        spans=tuple(span_names[s] for _, _, s in triples) if span_names else None,
        span_names=tuple(span_names),
        kv_view=graph.kv_view,
    )

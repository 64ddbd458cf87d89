"""Connectivity of units (edges, or edges at a span) in the residual-stream graph, resolved by
span: which kept units lie on a path from the embedding to the logits (:func:`prune`), each
unit's widest path (:func:`widest_paths`), and Hanna et al.'s greedy order
(:func:`greedy_order`).

The states are the writers and readers at each span. A kept unit ``writer -> reader`` at span
``s`` joins the writer at ``s`` to the reader at ``s`` (the residual stream at those positions);
a head's query input at ``s`` feeds its output at ``s``, its key and value inputs at any span
feed its output at every span (a grouped model's key/value head's inputs feed every head of its
group); an MLP's input at ``s`` feeds its output at ``s``; the embedding
is live at every span and the readout reads every span. Without spans there is one.
"""

from __future__ import annotations

import heapq

import numpy as np

from probes.circuits.graph import Graph, parse


def _node_readers(graph: Graph) -> list[tuple[int, list[int], list[int]]]:
    """Per writer node after the embedding, in depth order: ``(writer index, readers that act at
    the same span (a head's q, an MLP's input), readers that act at every span (k, v))``."""
    out = []
    for j, w in enumerate(graph.writers[1:], start=1):
        s = parse(w)
        if s.kind == "head":  # k and v: its key/value head's readers (shared in a group)
            out.append(
                (
                    j,
                    [graph.reader_index(f"{w}.q")],
                    [graph.reader_index(graph.reader_of(s.layer, s.head, c)) for c in "kv"],
                )
            )
        else:
            out.append((j, [graph.reader_index(w)], []))
    return out


def _forward(graph: Graph, weight: np.ndarray, reach_max: bool) -> np.ndarray:
    """Per writer and span, from the embedding: reachability (``weight`` bool, kept units) or the
    widest path (``weight`` float: the largest over paths of the smallest unit weight)."""
    R, W, S = weight.shape
    neg = False if not reach_max else -np.inf
    up = np.full((W, S), neg, dtype=weight.dtype)
    up[0] = True if not reach_max else np.inf
    for j, same, every in _node_readers(graph):

        def into(r: int, j: int = j) -> np.ndarray:  # [S]: the best way into reader r at each span
            cols = np.flatnonzero(graph.valid[r, :j])
            if reach_max:
                return np.minimum(weight[r, cols], up[cols]).max(0, initial=-np.inf)
            return (weight[r, cols] & up[cols]).any(0)

        vals = [into(r) for r in same]
        wide = [into(r) for r in every]
        if reach_max:
            best = np.max(vals, 0)
            for v in wide:
                best = np.maximum(best, v.max())
        else:
            best = np.any(vals, 0)
            for v in wide:
                best = best | v.any()
        up[j] = best
    return up


def backward_through(graph: Graph, weight: np.ndarray, reach_max: bool) -> np.ndarray:
    """Per reader and span, to the logits: whether it is used (bool) or its widest path."""
    R, W, S = weight.shape
    down = np.full((R, S), -np.inf if reach_max else False, dtype=weight.dtype)
    down[graph.reader_index("logits")] = np.inf if reach_max else True
    for j, same, every in reversed(_node_readers(graph)):
        rows = np.flatnonzero(graph.valid[:, j])
        if reach_max:
            out = np.minimum(weight[rows, j], down[rows]).max(0, initial=-np.inf)  # [S]
            for r in same:
                down[r] = out
            for r in every:  # a grouped key/value head's readers feed every head of its group
                down[r] = np.maximum(down[r], out.max())
        else:
            out = (weight[rows, j] & down[rows]).any(0)
            for r in same:
                down[r] = out
            for r in every:
                down[r] = down[r] | out.any()
    return down


def prune(graph: Graph, keep: np.ndarray) -> np.ndarray:
    """``keep`` (``[readers, writers, spans]`` bool) less every unit that lies on no path of kept
    units from the embedding to the logits."""
    keep = keep & graph.valid[..., None]
    live = _forward(graph, keep, False)
    used = backward_through(graph, keep, False)
    return keep & live[None] & used[:, None]


def widest_paths(graph: Graph, rank: np.ndarray) -> np.ndarray:
    """Each unit's widest path value: min(its rank, the widest path into its writer from the
    embedding, the widest path from its reader to the logits); -inf where there is no unit."""
    w = np.where(graph.valid[..., None], np.nan_to_num(rank, nan=-np.inf), -np.inf)
    up = _forward(graph, w, True)
    down = backward_through(graph, w, True)
    return np.minimum(np.minimum(w, up[None]), down[:, None])


def greedy_order(graph: Graph, rank: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Hanna et al.'s order: from the logits down, the best unit whose reader is in the circuit;
    units that never become candidates follow, by rank."""
    R, W, S = rank.shape
    into_node = {}
    for j, same, every in _node_readers(graph):
        into_node[j] = (same, every)
    in_reader = np.zeros((R, S), dtype=bool)
    heap: list[tuple[float, int]] = []

    def enter(r: int, s: int) -> None:
        if in_reader[r, s]:
            return
        in_reader[r, s] = True
        for w in np.flatnonzero(units[r, :, s]):
            flat = (r * W + w) * S + s
            heapq.heappush(heap, (-float(rank[r, w, s]), flat))

    for s in range(S):
        enter(graph.reader_index("logits"), s)
    order, seen_writer = [], np.zeros((W, S), dtype=bool)
    while heap:
        _, flat = heapq.heappop(heap)
        order.append(flat)
        r, rest = divmod(flat, W * S)
        w, s = divmod(rest, S)
        if w == 0 or seen_writer[w, s]:
            continue
        seen_writer[w, s] = True
        same, every = into_node[w]
        for q in same:
            enter(q, s)
        for q in every:
            for t in range(S):
                enter(q, t)
    taken = np.zeros(R * W * S, dtype=bool)
    taken[order] = True
    rest = np.flatnonzero(units.ravel() & ~taken)
    rest = rest[np.argsort(-rank.ravel()[rest], kind="stable")]
    return np.concatenate([np.asarray(order, dtype=np.int64), rest])


__all__ = ["greedy_order", "prune", "widest_paths"]

"""Faithfulness: a circuit run on the clean input with every edge outside it ablated, over circuit
size; the curve's area; the smallest circuit that reaches a target.

An ablated edge's reader reads the writer's term from another run instead of the live one
(TransformerLens' ``faithfulness`` rule, which :func:`ablated_metric` equals edge by edge):
the paired corrupt run's (``ablation="corrupt"``), a resampled clean example's
(``"resample"``: a seeded derangement) or their mean per position (``"mean"``), each a
:class:`probes.common.replace.Replacement` at the writer hooks, as any other passed instead. A
position-aware circuit keeps an edge at some spans of each example and ablates it at the
others. ``recovered = (m(circuit) - m(nothing kept)) / (m(clean) - m(nothing kept))``.

Select a circuit on one set of pairs and measure it on another (the CLI and the benchmarks use
held-out pairs, another seed of the same family).

The edges are those of the scores' graph: under grouped key/value heads, the view their
attribution took (``kv_view``, :mod:`probes.circuits.graph`), and a :class:`Circuit`'s own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.evaluator import ABLATIONS, EdgeEvaluator, has_gap, unit_span_names
from probes.circuits.graph import Graph, build_graph
from probes.circuits.scores import Attribution
from probes.circuits.selection import Circuit, Ranking, curve_area, default_sizes, rank_edges
from probes.common.inputs import takes_probe_model

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def _ranking(scores, *, select, positional, by) -> Ranking:
    if isinstance(scores, Ranking):
        return scores
    if isinstance(scores, Attribution | Mapping):
        return rank_edges(scores, select=select, positional=positional, by=by)
    raise ValueError(
        f"expected an Attribution, a mapping of them, a Ranking or a Circuit, got {type(scores).__name__}"
    )


def _circuit_masks(c: Circuit, graph: Graph, sizes: Sequence[int]) -> np.ndarray:
    names = c.span_names if c.positional else ("all",)
    keeps = np.zeros((len(sizes), *graph.valid.shape, len(names)), dtype=bool)
    for j, s in enumerate(sizes):
        for i, (w, r) in enumerate(c.edges[:s]):
            keeps[
                j,
                graph.reader_index(r),
                graph.writer_index(w),
                names.index(c.spans[i]) if c.positional else 0,
            ] = True
    return keeps


def _summary(ev: EdgeEvaluator, sizes, kept, per, total) -> dict[str, Any]:
    full, empty = ev.ends()
    m = per.mean(1)
    rec = (
        ((m - empty) / (full - empty)).tolist()
        if has_gap(full, empty)
        else [float("nan")] * len(sizes)
    )
    return {
        "sizes": list(map(int, sizes)),
        "kept": list(map(int, kept)),
        "metric": m.tolist(),
        "full": full,
        "empty": empty,
        "recovered": rec,
        "ablation": ev.ablation,
        "per_example": per,
        "total_edges": int(total),
        "area": curve_area(kept, rec, total) if {0, total} <= set(kept) else float("nan"),
    }


@takes_probe_model
def faithfulness_curve(
    model: ProbeModel,
    scores: Any,
    clean: Any,
    corrupt: Any = None,
    *,
    sizes: Sequence[int] | None = None,
    select: str = "paths",
    positional: bool = False,
    by: str | None = None,
    spans: Any = None,
    ablation: str = "corrupt",
    metric: Any = "margin",
    reference: Any = None,
    seed: int = 0,
    aligned: bool = False,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """The metric with the circuit of each size in ``sizes`` kept, every other edge ablated.

    ``scores``: edge attributions (ranked by :func:`probes.circuits.selection.rank_edges` with
    ``select``, ``positional``, ``by``), a :class:`Ranking`, or a :class:`Circuit` (its edges as
    listed, first ``n``, not pruned). ``spans``: the evaluated clean examples' spans (the task,
    or ``[n, pos]`` ids), for position-aware circuits. ``ablation``: ``"corrupt"`` (needs
    ``corrupt``), ``"resample"``, ``"mean"`` (over ``reference``, default the clean batch).
    ``aligned`` (with ``"corrupt"`` on position-only pairs): an ablated edge reads the corrupt
    run's term at each clean token's moved position (:func:`probes.attribute`'s ``aligned``).

    A size ``n`` is the circuit of the longest prefix of the ranking with at most ``n`` units.
    Returns ``{"sizes", "kept" (its units), "metric" (mean per size), "full",
    "empty", "recovered", "area" (:func:`curve_area`, when the sizes include 0 and the whole
    graph), "total_edges" (units), "ablation", "per_example" ([sizes, n])}``."""
    how = {
        "ablation": ablation,
        "metric": metric,
        "reference": reference,
        "seed": seed,
        "batch_size": batch_size,
        "aligned": aligned,
    }
    if isinstance(scores, Circuit):
        return _circuit_curve(model, scores, clean, corrupt, sizes, spans, how)
    r = _ranking(scores, select=select, positional=positional, by=by)
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        spans=spans if r.positional else None,
        n_spans=r.n_spans,
        who="faithfulness_curve",
        kv_view=r.graph.kv_view,
        **how,
    )
    if sizes is None:
        sizes = default_sizes(r.total)
    sizes = list(sizes)
    if any(s < 0 or s > r.total for s in sizes):
        raise ValueError(f"faithfulness_curve: sizes must be in 0..{r.total}")
    keeps = (
        np.stack([r.keep(r.prefix_for(s)) for s in sizes])
        if sizes
        else np.zeros((0, *r.rank.shape), dtype=bool)
    )
    out = _summary(ev, sizes, keeps.sum((1, 2, 3)), ev(keeps), r.total)
    out.update({"select": r.select, "positional": r.positional, "span_names": list(r.span_names)})
    return out


def _circuit_curve(model, c: Circuit, clean, corrupt, sizes, spans, how) -> dict[str, Any]:
    """:func:`faithfulness_curve` of a :class:`Circuit`: its first ``n`` edges as listed."""
    graph = build_graph(model.cfg, c.kv_view)
    n_spans = len(c.span_names) if c.positional else 1
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        spans=spans if c.positional else None,
        n_spans=n_spans,
        who="faithfulness_curve",
        kv_view=c.kv_view,
        **how,
    )
    sizes = list(sizes) if sizes is not None else [len(c.edges)]
    if any(s < 0 or s > len(c.edges) for s in sizes):
        raise ValueError(f"faithfulness_curve: sizes must be in 0..{len(c.edges)}")
    keeps = _circuit_masks(c, graph, sizes)
    total = c.total_edges
    out = _summary(ev, sizes, keeps.sum((1, 2, 3)), ev(keeps), total)
    out["total_edges"] = graph.n_edges * n_spans
    return out


def minimal_circuit(
    model: ProbeModel,
    scores: Any,
    clean: Any,
    corrupt: Any = None,
    *,
    target: float = 0.9,
    select: str = "paths",
    positional: bool = False,
    by: str | None = None,
    spans: Any = None,
    ablation: str = "corrupt",
    metric: Any = "margin",
    reference: Any = None,
    seed: int = 0,
    aligned: bool = False,
    batch_size: int | None = None,
    points: int = 16,
    per_round: int = 8,
    tolerance: float = 0.0,
    progress: bool = False,
) -> Circuit:
    """The smallest circuit of the ranking that recovers at least ``target`` on these pairs.

    The curve is measured at :func:`default_sizes` (``points``; the empty and the whole graph are
    the clean and corrupt runs), then between the last size below the target and the first at or
    above it, ``per_round`` sizes at a time, until they are adjacent, or with ``tolerance`` until
    they are at most ``tolerance`` of the larger apart (each measured size costs one forward of
    the pairs). Faithfulness need not grow with size, so a smaller circuit than the one returned
    may reach the target between the measured sizes; the returned circuit's own faithfulness is
    measured. Its ``faithfulness`` holds ``"target"``, ``"kept"`` (its recovered share),
    ``"size"``, and the measured curve (``"sizes"``, ``"kept_sizes"``, ``"recovered"``,
    ``"metric"``, ``"full"``, ``"empty"``, ``"area"``, ``"total_edges"``, ``"forwards"``: the
    circuits measured). ``progress``: a bar of the circuits measured, with an ETA."""
    if not isinstance(target, int | float) or not 0 < target <= 1:
        raise ValueError(f"minimal_circuit: target must be in (0, 1], got {target!r}")
    if per_round < 1 or points < 2 or not 0 <= tolerance < 1:
        raise ValueError(
            f"minimal_circuit: per_round >= 1, points >= 2 and tolerance in [0, 1) are needed, "
            f"got {per_round}, {points} and {tolerance}"
        )
    r = _ranking(scores, select=select, positional=positional, by=by)
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        ablation=ablation,
        metric=metric,
        reference=reference,
        seed=seed,
        batch_size=batch_size,
        spans=spans if r.positional else None,
        n_spans=r.n_spans,
        aligned=aligned,
        who="minimal_circuit",
        kv_view=r.graph.kv_view,
    )
    search = _Search(r, ev, target, progress)
    hi = search.run(points, per_round, tolerance)
    c = r.circuit(hi)
    c.meta["selection"].update({"target": float(target)})
    faith = search.record(hi, ablation=ev.ablation, aligned=aligned, tolerance=tolerance)
    return Circuit(**{**c.__dict__, "faithfulness": faith})


class _Search:
    """The search of :func:`minimal_circuit`: every size measured (``seen``: size -> (kept,
    recovered, metric)), the clean and corrupt ends, and the circuits measured (``forwards``)."""

    def __init__(self, r: Ranking, ev: EdgeEvaluator, target: float, progress: bool):
        self.r, self.ev, self.target = r, ev, target
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=2, desc=f"smallest circuit >= {target:g}", unit="circuit")
        self.full, self.empty = ev.ends()  # the whole graph and nothing kept: 2 circuits
        self.forwards = 2
        self._advance(2)
        gap = has_gap(self.full, self.empty)
        self.seen: dict[int, tuple[int, float, float]] = {
            0: (0, 0.0 if gap else float("nan"), self.empty),
            r.total: (int(r.keep(r.total).sum()), 1.0 if gap else float("nan"), self.full),
        }

    def record(self, hi: int, **how: Any) -> dict[str, Any]:
        """:func:`minimal_circuit`'s ``faithfulness`` for the prefix ``hi``: its own, the curve
        measured, and ``how`` it was measured."""
        seen, r = self.seen, self.r
        sizes = sorted(seen)
        kept = [seen[n][0] for n in sizes]
        rec = [seen[n][1] for n in sizes]
        return {
            "target": float(self.target),
            "kept": seen[hi][1],
            "size": seen[hi][0],
            "prefix": int(hi),
            "metric_kept": seen[hi][2],
            "sizes": sizes,
            "kept_sizes": kept,
            "recovered": rec,
            "metric": [seen[n][2] for n in sizes],
            "full": self.full,
            "empty": self.empty,
            "area": curve_area(kept, rec, r.total),
            "total_edges": r.total,
            "ablation": how["ablation"],
            "aligned": bool(how["aligned"]),
            "select": r.select,
            "positional": r.positional,
            "n_pairs": len(self.ev.c),
            "tolerance": float(how["tolerance"]),
            "forwards": self.forwards,
        }

    def _advance(self, n: int, total: int | None = None) -> None:
        if self.bar is not None:
            if total is not None:
                self.bar.total = total
            self.bar.update(n)

    def measure(self, ns: Sequence[int]) -> None:
        ns = [n for n in dict.fromkeys(ns) if n not in self.seen]
        if not ns:
            return
        keeps = np.stack([self.r.keep(n) for n in ns])
        m = self.ev(keeps).mean(1)
        full, empty = self.full, self.empty
        for n, kk, v in zip(ns, keeps.sum((1, 2, 3)), m):
            self.seen[n] = (
                int(kk),
                float((v - empty) / (full - empty)) if has_gap(full, empty) else float("nan"),
                float(v),
            )
        self.forwards += len(ns)
        self._advance(len(ns))

    def run(self, points: int, per_round: int, tolerance: float) -> int:
        """The smallest prefix found to reach the target."""
        r, seen, target = self.r, self.seen, self.target
        grid = default_sizes(r.total, points)
        self._advance(0, self.forwards + len([n for n in grid if n not in seen]))
        self.measure(grid)
        hit = [n for n in grid if seen[n][1] >= target]
        hi = hit[0] if hit else r.total
        lo = max([n for n in grid if n < hi], default=0)

        def close(lo: int, hi: int) -> bool:
            return hi - lo <= max(1, tolerance * hi)

        while not close(lo, hi):
            # the rounds left, each of per_round sizes dividing the gap by per_round + 1 (the ETA)
            width = (hi - lo) / max(1, tolerance * hi)
            rounds = int(np.ceil(np.log(width) / np.log(per_round + 1)))
            self._advance(0, self.forwards + max(1, rounds) * per_round)
            step = np.unique(np.linspace(lo, hi, per_round + 2).astype(int))[1:-1]
            self.measure(step.tolist())
            inside = [n for n in sorted(seen) if lo < n < hi]
            first = next((n for n in inside if seen[n][1] >= target), None)
            if first is not None:
                hi = first
            lo = max([n for n in inside if n < hi], default=lo)
            if not len(step):
                break
        if self.bar is not None:
            self.bar.total = self.bar.n
            self.bar.close()
        return hi


__all__ = [
    "ABLATIONS",
    "ablated_metric",
    "curve_area",
    "default_sizes",
    "faithfulness_curve",
    "minimal_circuit",
    "unit_span_names",
]

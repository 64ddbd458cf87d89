"""Faithfulness: a circuit run on the clean input with every edge outside it ablated, over circuit
size; the curve's area; the smallest circuit that reaches a target.

An ablated edge's reader reads the writer's term from another run instead of the live one
(TransformerLens' ``faithfulness`` rule, which :func:`ablated_metric` equals edge by edge):
the paired corrupt run's (``ablation="corrupt"``), a resampled clean example's
(``"resample"``: a seeded derangement) or their mean per position (``"mean"``). A
position-aware circuit keeps an edge at some spans of each example and ablates it at the
others. ``recovered = (m(circuit) - m(nothing kept)) / (m(clean) - m(nothing kept))``.

Select a circuit on one set of pairs and measure it on another (the CLI and the benchmarks use
held-out pairs, another seed of the same family).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.modes import eval_mode
from probes.circuits.alignment import align, moved
from probes.circuits.engine import (
    Run,
    as_pair,
    as_run,
    capture,
    contributions,
    forks,
    pair_labels,
    reader_groups,
    resolve,
    writer_hooks,
    writer_term,
)
from probes.circuits.graph import Graph, build_graph
from probes.circuits.scores import Attribution, span_ids
from probes.circuits.selection import Circuit, Ranking, curve_area, default_sizes, rank_edges
from probes.inputs import check_count, check_finite_model, takes_probe_model
from probes.metrics import resample_sources
from probes.options import FAITHFULNESS_ABLATIONS
from probes.replace import position_means

ABLATIONS = FAITHFULNESS_ABLATIONS


def ablated_metric(
    model,
    graph: Graph,
    run: Run,
    repl: Tensor,
    keep: Tensor,
    fn,
    good,
    bad,
    spans: Tensor | None = None,
) -> Tensor:
    """Per-example metric ``[k, b]`` of ``k`` copies of ``run``, copy ``j`` keeping the edges where
    ``keep[j, reader, writer]`` and reading ``repl`` (``[b or 1, pos, writers, d]``) for the rest.
    Position-aware: ``keep[j, reader, writer, span]`` with ``spans`` (``[b, pos]`` span ids).
    A float ``keep`` in [0, 1] is a soft mask (the reader reads ``keep * live + (1 - keep) *
    repl``); one that requires grad is differentiated through (:mod:`probes.circuits.learned`).

    A reader's input is its live value plus, for each ablated writer, the replacement minus the
    live term: one batched contraction per reader hook, of the differences of every writer before
    it (each writer's computed once, when its hook has fired) with the mask at each position's
    span."""
    k, b = keep.shape[0], len(run)
    if keep.ndim == 3:
        keep = keep[..., None]
    if spans is None and keep.shape[-1] != 1:
        raise ValueError("ablated_metric: a keep mask per span needs spans=")
    valid = torch.as_tensor(graph.valid, device=keep.device)[..., None]
    soft = keep.dtype != torch.bool
    excl = ((1 - keep.to(repl.dtype)) if soft else (~keep).to(repl.dtype)) * valid  # [k, R, W, S]
    P, d = run.tokens.shape[1], model.cfg.d_model
    ids = None if spans is None else spans.to(keep.device).long()
    live: dict[str, Tensor] = {}
    diffs: dict[str, Tensor] = {}  # per writer hook
    prefixes: dict[int, Tensor] = {}  # writers 0..w-1, concatenated
    chunks, col = [], 0  # (writer hook, its first writer column, its number of writers)
    for name in writer_hooks(graph):
        n = graph.n_heads if name.endswith("hook_z") else 1
        chunks.append((name, col, n))
        col += n

    def grab(x, hook, name):  # the name asked for (a bridge's hook.name is its own)
        live[name] = x
        return None

    def diff(name: str, c0: int, n: int) -> Tensor:
        """Replacement minus live term of one hook's writers, ``[k, b, P, n, d]``."""
        if name not in diffs:
            diffs[name] = repl[:, :, c0 : c0 + n] - writer_term(model, name, live[name]).reshape(
                k, b, P, n, d
            )
        return diffs[name]

    def upto(w: int) -> Tensor:
        """The differences of writers ``0..w-1``, ``[k, b, P, w, d]`` (concatenated once per prefix)."""
        if w not in prefixes:
            prefixes[w] = torch.cat([diff(name, c0, n) for name, c0, n in chunks if c0 < w], dim=3)
        return prefixes[w]

    def fix(idx: list[int], per_head: bool):
        reads = graph.valid[idx]  # [readers, writers]
        w = (
            int(np.flatnonzero(reads.any(0)).max()) + 1
        )  # writers 0..w-1: every one that writes here

        def hook(x, hook):
            ex = excl[:, idx, :w]  # [k, readers, w, S]
            if not soft and not bool(ex.any()):
                return x
            if ids is None:
                add = torch.einsum("kbpwd,krw->kbprd", upto(w), ex[..., 0])
            else:
                add = torch.einsum("kbpwd,krwbp->kbprd", upto(w), ex[..., ids])
            return x + (
                add.reshape(k * b, P, len(idx), d) if per_head else add.reshape(k * b, P, d)
            )

        return hook

    hooks = [(n, partial(grab, name=n)) for n in writer_hooks(graph)]
    hooks += [(h, fix(idx, ph)) for h, idx, _, ph in reader_groups(graph)]
    tokens = run.tokens.repeat(k, 1)
    kv = None if run.key_valid is None else run.key_valid.repeat(k, 1)
    with forks(model), torch.set_grad_enabled(keep.requires_grad), model.hooks(fwd_hooks=hooks):
        logits = model.forward_unchecked(tokens, kv)
    return fn(logits, good.repeat(k), bad.repeat(k)).double().view(k, b)


def has_gap(full: float, empty: float) -> bool:
    """Whether the clean and the corrupt runs score differently beyond rounding (a relative 1e-6:
    the two are computed through differently batched forwards)."""
    return abs(full - empty) > 1e-6 * max(1.0, abs(full), abs(empty))


def _resampled(c: Run, sl: slice, seed: int) -> Run:
    src = resample_sources(len(c), None, seed).to(c.tokens.device)[sl]
    kv = None if c.key_valid is None else c.key_valid[src]
    return Run(c.tokens[src], kv, c.pad_mask[src], c.labels[src])


def unit_span_names(spans: Any, span_names: Any, who: str) -> tuple[str, ...]:
    """The span names of units per span: the task's, or ``span_names`` beside span ids; ``()``
    without spans."""
    if spans is None:
        return ()
    names = tuple(spans.span_names) if hasattr(spans, "span_names") else tuple(span_names or ())
    if not names:
        raise ValueError(f"{who}: span ids need span_names=")
    return names


class _Evaluator:
    """Measures keep masks ``[k, readers, writers, spans]`` on fixed pairs: the mean metric of
    each, the clean run's (everything kept) and the corrupt one's (nothing kept)."""

    def __init__(
        self,
        model,
        clean,
        corrupt,
        *,
        ablation,
        metric,
        reference,
        seed,
        batch_size,
        spans,
        n_spans,
        aligned: bool = False,
        who: str = "faithfulness",
    ):
        if ablation not in ABLATIONS:
            raise ValueError(
                f"{who}: ablation must be one of {', '.join(ABLATIONS)}; got {ablation!r}"
            )
        if batch_size is not None:
            check_count(batch_size, "batch_size", 1, who)
        check_finite_model(model, who)
        self.model, self.graph = model, build_graph(model.cfg)
        clean_batch = clean.clean if hasattr(clean, "clean") else clean
        self.c, self.k = as_pair(model, clean, corrupt, who)
        if ablation == "corrupt" and self.k is None:
            raise ValueError(f"{who}: ablation='corrupt' needs corrupt= (or CounterfactualPairs)")
        if aligned and ablation != "corrupt":
            raise ValueError(
                f"{who}: aligned=True reads the corrupt run at each token's moved position; it needs "
                f"ablation='corrupt', got {ablation!r}"
            )
        self.sigma = moved(self.c, self.k, who) if aligned else None
        self.ids = None
        if n_spans > 1 or spans is not None:
            if spans is None:  # a circuit of spans, evaluated without them
                raise ValueError(
                    "faithfulness: a position-aware circuit needs the evaluated examples' spans (spans=task or ids)"
                )
            raw = spans.spans(clean_batch) if hasattr(spans, "spans") else spans
            self.ids, _ = span_ids(raw, None, self.c.tokens.shape, "faithfulness")
            if int(self.ids.max()) >= n_spans:
                raise ValueError(
                    f"faithfulness: span ids go to {int(self.ids.max())}, the circuit has {n_spans} spans"
                )
        self.n_spans = n_spans
        _, self.fn = resolve(metric)
        self.good, self.bad = pair_labels(self.c, self.k)
        self.rows = batch_size or 256
        self.ablation, self.seed = ablation, seed
        names = writer_hooks(self.graph)
        self.repl_all = None
        if ablation == "mean":
            with eval_mode(model):
                ref = (
                    self.c
                    if reference is None
                    else as_run(model, reference, what="reference", who=who)
                )
                means = position_means(model, ref.tokens, ref.pad_mask, names, self.rows)
                P = self.c.tokens.shape[1]
                self.repl_all = contributions(
                    model, self.graph, {n: m[None, :P] for n, m in means.items()}
                ).detach()
        self._full = self._empty = None

    def __call__(self, keeps: np.ndarray) -> np.ndarray:
        """Per-example metric ``[len(keeps), n]``."""
        model, graph, c = self.model, self.graph, self.c
        keep = torch.as_tensor(np.asarray(keeps, dtype=bool), device=c.tokens.device)
        out = torch.empty(keep.shape[0], len(c), dtype=torch.float64)
        chunk = max(1, min(len(c), self.rows))
        per = max(1, self.rows // chunk)
        names = writer_hooks(graph)
        with eval_mode(model):
            for c0 in range(0, len(c), chunk):
                sl = slice(c0, c0 + chunk)
                if self.repl_all is not None:
                    repl = self.repl_all
                else:
                    src = (
                        self.k.rows(sl)
                        if self.ablation == "corrupt"
                        else _resampled(c, sl, self.seed)
                    )
                    with torch.no_grad():
                        acts = capture(model, src, names)[0]
                        repl = contributions(
                            model,
                            graph,
                            align(acts, None if self.sigma is None else self.sigma[sl]),
                        )
                sp = None if self.ids is None else self.ids[sl].to(c.tokens.device)
                for j0 in range(0, keep.shape[0], per):
                    out[j0 : j0 + per, sl] = ablated_metric(
                        model,
                        graph,
                        c.rows(sl),
                        repl,
                        keep[j0 : j0 + per],
                        self.fn,
                        self.good[sl],
                        self.bad[sl],
                        sp,
                    ).cpu()
        return out.numpy()

    def units(self) -> np.ndarray:
        """``[readers, writers, spans]``: the graph's edges at each span some example occupies
        (a span of pads only holds none where the model masks its pads)."""
        units = np.broadcast_to(
            self.graph.valid[..., None], (*self.graph.valid.shape, self.n_spans)
        ).copy()
        if self.ids is not None:
            pads = self.c.pad_mask.cpu()
            real = pads if self.model.cfg.mask_padding else torch.ones_like(pads)
            units &= np.array([bool(((self.ids == s) & real).any()) for s in range(self.n_spans)])[
                None, None
            ]
        return units

    def ends(self) -> tuple[float, float]:
        """Mean metric with everything kept (the clean run) and with nothing kept."""
        if self._full is None:
            shape = (*self.graph.valid.shape, self.n_spans)
            both = self(np.stack([np.ones(shape, dtype=bool), np.zeros(shape, dtype=bool)]))
            self._full, self._empty = float(both[0].mean()), float(both[1].mean())
        return self._full, self._empty


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


def _summary(ev: _Evaluator, sizes, kept, per, total) -> dict[str, Any]:
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
    model,
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
    if isinstance(scores, Circuit):
        graph = build_graph(model.cfg)
        n_spans = len(scores.span_names) if scores.positional else 1
        ev = _Evaluator(
            model,
            clean,
            corrupt,
            ablation=ablation,
            metric=metric,
            reference=reference,
            seed=seed,
            batch_size=batch_size,
            spans=spans if scores.positional else None,
            n_spans=n_spans,
            aligned=aligned,
            who="faithfulness_curve",
        )
        sizes = list(sizes) if sizes is not None else [len(scores.edges)]
        if any(s < 0 or s > len(scores.edges) for s in sizes):
            raise ValueError(f"faithfulness_curve: sizes must be in 0..{len(scores.edges)}")
        keeps = _circuit_masks(scores, graph, sizes)
        total = scores.total_edges
        out = _summary(ev, sizes, keeps.sum((1, 2, 3)), ev(keeps), total)
        out["total_edges"] = graph.n_edges * n_spans
        return out
    r = _ranking(scores, select=select, positional=positional, by=by)
    ev = _Evaluator(
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
        who="faithfulness_curve",
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


def minimal_circuit(
    model,
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
) -> Circuit:
    """The smallest circuit of the ranking that recovers at least ``target`` on these pairs.

    The curve is measured at :func:`default_sizes`, then between the last size below the target
    and the first at or above it, 8 sizes at a time, until they are adjacent. Faithfulness need
    not grow with size, so a smaller circuit than the one returned may reach the target between
    the measured sizes; the returned circuit's own faithfulness is measured. Its
    ``faithfulness`` holds ``"target"``, ``"kept"`` (its recovered share), ``"size"``, and the
    measured curve (``"sizes"``, ``"kept_sizes"``, ``"recovered"``, ``"metric"``, ``"full"``,
    ``"empty"``, ``"area"``, ``"total_edges"``)."""
    if not isinstance(target, int | float) or not 0 < target <= 1:
        raise ValueError(f"minimal_circuit: target must be in (0, 1], got {target!r}")
    r = _ranking(scores, select=select, positional=positional, by=by)
    ev = _Evaluator(
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
    )
    full, empty = ev.ends()
    seen: dict[int, tuple[int, float, float]] = {}  # size -> (kept, recovered, metric)

    def measure(ns: Sequence[int]) -> None:
        ns = [n for n in dict.fromkeys(ns) if n not in seen]
        if not ns:
            return
        keeps = np.stack([r.keep(n) for n in ns])
        m = ev(keeps).mean(1)
        for n, kk, v in zip(ns, keeps.sum((1, 2, 3)), m):
            seen[n] = (
                int(kk),
                float((v - empty) / (full - empty)) if has_gap(full, empty) else float("nan"),
                float(v),
            )

    grid = default_sizes(r.total, points)
    measure(grid)
    hit = [n for n in grid if seen[n][1] >= target]
    hi = hit[0] if hit else r.total
    lo = max([n for n in grid if n < hi], default=0)
    while hi - lo > 1:
        step = np.unique(np.linspace(lo, hi, 10).astype(int))[1:-1]
        measure(step.tolist())
        inside = [n for n in sorted(seen) if lo < n < hi]
        first = next((n for n in inside if seen[n][1] >= target), None)
        if first is not None:
            hi = first
        lo = max([n for n in inside if n < hi], default=lo)
        if not len(step):
            break
    sizes = sorted(seen)
    kept = [seen[n][0] for n in sizes]
    rec = [seen[n][1] for n in sizes]
    c = r.circuit(hi)
    faith = {
        "target": float(target),
        "kept": seen[hi][1],
        "size": seen[hi][0],
        "prefix": int(hi),
        "metric_kept": seen[hi][2],
        "sizes": sizes,
        "kept_sizes": kept,
        "recovered": rec,
        "metric": [seen[n][2] for n in sizes],
        "full": full,
        "empty": empty,
        "area": curve_area(kept, rec, r.total),
        "total_edges": r.total,
        "ablation": ablation,
        "aligned": bool(aligned),
        "select": r.select,
        "positional": r.positional,
        "n_pairs": len(ev.c),
    }
    c.meta["selection"].update({"target": float(target)})
    return Circuit(**{**c.__dict__, "faithfulness": faith})


__all__ = [
    "ABLATIONS",
    "ablated_metric",
    "curve_area",
    "default_sizes",
    "faithfulness_curve",
    "minimal_circuit",
    "unit_span_names",
]

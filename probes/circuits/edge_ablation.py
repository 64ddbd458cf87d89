"""A circuit's metric with every edge outside it ablated, and the evaluator that measures keep masks.

:func:`ablated_metric`: an ablated edge's reader reads the writer's term from another run instead
of the live one (TransformerLens' ``faithfulness`` rule). What it reads is a
:class:`probes.common.replace.Replacement` at the writer hooks (:func:`replaced_terms`), built once
from :data:`ABLATIONS`' shorthand (the paired corrupt run's, σ-aligned where asked; a resampled
clean example's, a seeded derangement; their mean per position) or passed as one (zero, say).
:class:`EdgeEvaluator` measures keep masks ``[k, readers, writers, spans]`` on fixed pairs, with the
clean run (everything kept) and the corrupt one (nothing kept) as the ends of the scale. Used by
:mod:`probes.circuits.faithfulness`, :mod:`probes.circuits.acdc` and :mod:`probes.circuits.learned`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.util.modes import eval_mode
from probes.circuits.alignment import moved
from probes.circuits.engine import (
    Run,
    as_pair,
    as_run,
    forks,
    merge_hooks,
    pair_labels,
    reader_groups,
    resolve,
    to_fork,
    writer_chunks,
    writer_hooks,
    writer_term,
)
from probes.circuits.graph import Graph, build_graph, check_kv_view
from probes.circuits.post_norm import norm_inputs, post_norms
from probes.circuits.scores import span_ids
from probes.common.inputs import check_count, check_finite_model
from probes.common.options import FAITHFULNESS_ABLATIONS
from probes.common.replace import Replacement, replacement

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = [
    "ABLATIONS",
    "EdgeEvaluator",
    "ablated_metric",
    "edge_replacement",
    "has_gap",
    "replaced_terms",
    "unit_span_names",
]


ABLATIONS = FAITHFULNESS_ABLATIONS
MEMORY_BUDGET = 2 << 30  # bytes of writer differences one evaluation forward may hold


def ablated_metric(
    model: ProbeModel,
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
    span. Where a norm follows a writer's block the differences go inside it and the norm is
    recomputed, per reader (:mod:`probes.circuits.post_norm`). The ungrouped view of grouped
    key/value heads runs ``graph.kv_split`` copies of the rows
    (:func:`probes.circuits.engine.merge_hooks`)."""
    k, b = keep.shape[0], len(run)
    split = graph.kv_split
    if keep.ndim == 3:
        keep = keep[..., None]
    if spans is None and keep.shape[-1] != 1:
        raise ValueError("ablated_metric: a keep mask per span needs spans=")
    valid = torch.as_tensor(graph.valid, device=keep.device)[..., None]
    soft = keep.dtype != torch.bool
    excl = ((1 - keep.to(repl.dtype)) if soft else (~keep).to(repl.dtype)) * valid  # [k, R, W, S]
    ids = None if spans is None else spans.to(keep.device).long()
    edits = _ReaderEdits(model, graph, repl, excl, ids, soft, (k, b, run.tokens.shape[1]))
    tokens = run.tokens.repeat(k * split, 1)
    kv = None if run.key_valid is None else run.key_valid.repeat(k * split, 1)
    with (
        forks(model),
        torch.set_grad_enabled(keep.requires_grad),
        model.hooks(fwd_hooks=merge_hooks(model, split) + edits.hooks()),
    ):
        logits = model.forward_unchecked(tokens, kv)[: k * b]
    return fn(logits, good.repeat(k), bad.repeat(k)).double().view(k, b)


def _mix(diffs: Tensor, ex: Tensor, ids: Tensor | None) -> Tensor:
    """``sum_w ex[k, r, w] diffs[k, b, p, w]`` per reader, ``[k, b, p, readers, d]``: the mask at
    each position's span where ``ids`` (``[b, p]``) are given."""
    if ids is None:
        return torch.einsum("kbpwd,krw->kbprd", diffs, ex[..., 0])
    return torch.einsum("kbpwd,krwbp->kbprd", diffs, ex[..., ids])


class _ReaderEdits:
    """The hooks of one :func:`ablated_metric` forward: the writers' live terms as their hooks fire,
    and each reader hook's edit. Memory: the writers' differences ``[k, b, pos, writers, d]`` and
    one concatenated prefix of those without a norm after them (``EdgeEvaluator``'s budget holds
    two such); where norms follow every block the prefix is the embedding's alone, and a normed
    block's edit holds a few ``[k, b, pos, readers, d]`` (readers ≤ heads) at a time instead,
    within that budget from six layers on."""

    def __init__(self, model, graph, repl, excl, ids, soft, shape):
        self.model, self.graph, self.repl = model, graph, repl
        self.excl, self.ids, self.soft = excl, ids, soft  # [k, R, W, S], [b, P] or None
        self.k, self.b, self.P = shape
        self.d = model.cfg.d_model
        self.norms = post_norms(model, graph)
        self.chunks = writer_chunks(graph)
        self.live: dict[str, Tensor] = {}
        self.diffs: dict[str, Tensor] = {}  # per writer hook
        self.base: dict[str, Tensor] = {}  # per norm: N(S) of the live S
        # the writers without a norm below w, concatenated: the last prefix only (readers come in
        # depth order, so w never falls); keeping one per reader layer held O(layers^2) copies
        self.prefix: tuple = (None, [], None)

    def hooks(self) -> list:
        names = dict.fromkeys(writer_hooks(self.graph) + norm_inputs(self.norms))
        hooks = [(n, partial(self.grab, name=n)) for n in names]
        return hooks + [(h, self.fix(h, idx, ph)) for h, idx, _, ph in reader_groups(self.graph)]

    def grab(self, x, hook, name):  # the name asked for (a bridge's hook.name is its own)
        self.live[name] = x[: self.k * self.b]  # the ungrouped view's copies agree here

    def diff(self, name: str, c0: int, n: int) -> Tensor:
        """Replacement minus live term of one hook's writers, ``[k, b, P, n, d]``."""
        if name not in self.diffs:
            live = writer_term(self.model, name, self.live[name])
            self.diffs[name] = self.repl[:, :, c0 : c0 + n] - live.reshape(
                self.k, self.b, self.P, n, self.d
            )
        return self.diffs[name]

    def linear(self, w: int) -> tuple[list[int], Tensor | None]:
        """The columns of the writers below ``w`` without a norm after them, and their differences
        ``[k, b, P, columns, d]`` (concatenated once per prefix)."""
        if self.prefix[0] != w:
            self.prefix = (None, [], None)  # freed before the next one is built
            on = [c for c in self.chunks if c[1] < w and c[0] not in self.norms]
            cols = [j for _, c0, n in on for j in range(c0, c0 + n)]
            self.prefix = (w, cols, torch.cat([self.diff(*c) for c in on], 3) if on else None)
        return self.prefix[1], self.prefix[2]

    def normed(self, name: str, c0: int, n: int, ex: Tensor) -> Tensor | None:
        """What one normed block's ablated writers (``ex``: ``[k, readers, n, S]``) add to each
        reader: ``N(S + their differences) - N(S)``, ``[k, b, P, readers, d]``; None where none is."""
        if not self.soft and not bool(ex.any()):
            return None
        norm = self.norms[name]
        at = self.live[norm.hook_in].reshape(self.k, self.b, self.P, 1, self.d)
        if norm.hook_in not in self.base:
            self.base[norm.hook_in] = norm.norm(at)
        return norm.norm(at + _mix(self.diff(name, c0, n), ex, self.ids)) - self.base[norm.hook_in]

    def fix(self, at: str, idx: list[int], per_head: bool):
        reads = self.graph.valid[idx]  # [readers, writers]
        w = (
            int(np.flatnonzero(reads.any(0)).max()) + 1
        )  # writers 0..w-1: every one that writes here
        k, b, P, d = self.k, self.b, self.P, self.d

        def hook(x, hook):
            ex = self.excl[:, idx, :w]  # [k, readers, w, S]
            if not self.soft and not bool(ex.any()):
                return x
            cols, diffs = self.linear(w)
            add = (
                None
                if not cols
                else _mix(diffs, ex if len(cols) == w else ex[:, :, cols], self.ids)
            )
            for name, c0, n in self.chunks:
                if c0 < w and name in self.norms:
                    part = self.normed(name, c0, n, ex[:, :, c0 : c0 + n])
                    if part is not None:
                        add = part if add is None else add + part
            if add is None:
                return x
            add = add.reshape(k * b, P, len(idx), d) if per_head else add.reshape(k * b, P, d)
            return x + to_fork(add, at, self.graph.kv_split)

        return hook


def has_gap(full: float, empty: float) -> bool:
    """Whether the clean and the corrupt runs score differently beyond rounding (a relative 1e-6:
    the two are computed through differently batched forwards)."""
    return abs(full - empty) > 1e-6 * max(1.0, abs(full), abs(empty))


def replaced_terms(
    model: ProbeModel, graph: Graph, values: dict[str, Tensor | None], width: int
) -> Tensor:
    """The writers' residual terms ``[b or 1, width, writers, d_model]`` of a replacement's values
    at :func:`~probes.circuits.engine.writer_hooks` (:meth:`Replacement.for_chunk`'s: None is
    zero; a value for every row is one row, which :func:`ablated_metric` broadcasts)."""
    terms: dict[str, Tensor | None] = {}
    for name in writer_hooks(graph):
        v, per_row = values[name], 4 if name.endswith("attn.hook_z") else 3  # [b, pos, (H,) d]
        terms[name] = (
            None if v is None else writer_term(model, name, v if v.ndim == per_row else v[None])
        )
    b = max((t.shape[0] for t in terms.values() if t is not None), default=1)
    d = model.cfg.d_model
    return torch.cat(
        [
            model.W_E.new_zeros(b, width, graph.n_heads if n.endswith("attn.hook_z") else 1, d)
            if t is None
            else t.expand(b, -1, -1, -1)
            for n, t in terms.items()
        ],
        dim=2,
    )


def edge_replacement(
    model: ProbeModel,
    graph: Graph,
    ablation: str,
    clean: Run,
    corrupt: Run | None,
    *,
    reference: Any,
    rows: int,
    who: str,
    sigma: Tensor | None = None,
    seed: int = 0,
) -> Replacement:
    """The :class:`~probes.common.replace.Replacement` at every writer hook that the shorthand
    ``ablation`` names (:func:`probes.common.replace.replacement`), for the clean rows: ``"zero"``,
    ``"corrupt"`` (the paired corrupt run, read at ``sigma`` where given), ``"resample"`` (a seeded
    derangement of the clean rows) or ``"mean"`` per position over ``reference`` (default the
    clean rows; ``rows`` a forward), refused in one line where shorter than the examples."""
    other = corrupt if ablation == "corrupt" else None
    if ablation == "mean" and reference is not None:
        other = as_run(model, reference, what="reference", who=who)
        if other.tokens.shape[1] < clean.tokens.shape[1]:
            raise ValueError(
                f"{who}: the reference is shorter ({other.tokens.shape[1]}) than the examples "
                f"({clean.tokens.shape[1]})"
            )
    return replacement(
        model,
        ablation,
        writer_hooks(graph),
        clean.tokens,
        clean.pad_mask,
        reference=None if other is None else (other.tokens, other.pad_mask),
        sigma=sigma,
        seed=seed,
        batch_size=rows,
    )


def unit_span_names(spans: Any, span_names: Any, who: str) -> tuple[str, ...]:
    """The span names of units per span: the task's, or ``span_names`` beside span ids; ``()``
    without spans."""
    if spans is None:
        return ()
    names = tuple(spans.span_names) if hasattr(spans, "span_names") else tuple(span_names or ())
    if not names:
        raise ValueError(f"{who}: span ids need span_names=")
    return names


def _given(model: ProbeModel, ablation: Any, who: str) -> bool:
    """Whether ``ablation`` is a Replacement (at every writer hook) rather than a name of
    :data:`ABLATIONS`; a one-line error for anything else."""
    if isinstance(ablation, str) or not hasattr(ablation, "for_chunk"):
        if ablation not in ABLATIONS:
            raise ValueError(
                f"{who}: ablation must be one of {', '.join(ABLATIONS)} or a Replacement; "
                f"got {ablation!r}"
            )
        return False
    missing = sorted(set(writer_hooks(build_graph(model.cfg))) - set(ablation.names))
    if missing:
        raise ValueError(f"{who}: the Replacement leaves writer hooks out: {', '.join(missing)}")
    return True


class EdgeEvaluator:
    """Measures keep masks ``[k, readers, writers, spans]`` on fixed pairs: the mean metric of
    each, the clean run's (everything kept) and the corrupt one's (nothing kept). ``ablation``:
    one of :data:`ABLATIONS` (built once, :func:`edge_replacement`) or a
    :class:`~probes.common.replace.Replacement` at every writer hook."""

    def __init__(
        self,
        model: ProbeModel,
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
        kv_view: str = "grouped",
    ):
        given = _given(model, ablation, who)
        if batch_size is not None:
            check_count(batch_size, "batch_size", 1, who)
        check_kv_view(kv_view, who)
        check_finite_model(model, who)
        self.model, self.graph = model, build_graph(model.cfg, kv_view)
        clean_batch = clean.clean if hasattr(clean, "clean") else clean
        self.c, self.k = as_pair(model, clean, corrupt, who)
        if ablation == "corrupt" and self.k is None:
            raise ValueError(f"{who}: ablation='corrupt' needs corrupt= (or CounterfactualPairs)")
        if aligned and ablation != "corrupt":
            raise ValueError(
                f"{who}: aligned=True reads the corrupt run at each token's moved position; it needs "
                f"ablation='corrupt', got {ablation!r}"
            )
        sigma = moved(self.c, self.k, who) if aligned else None
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
        self.replacement = (
            ablation
            if given
            else edge_replacement(
                model,
                self.graph,
                ablation,
                self.c,
                self.k,
                reference=reference,
                rows=self.rows,
                who=who,
                sigma=sigma,
                seed=seed,
            )
        )
        self.ablation = self.replacement.method
        self._full = self._empty = None

    def terms(self, idx: Tensor) -> Tensor:
        """What an ablated edge's reader reads of each writer for the clean rows ``idx``: the
        writers' terms of the replacement, ``[len(idx) or 1, pos, writers, d_model]``."""
        with torch.no_grad():
            width = self.c.tokens.shape[1]
            values = self.replacement.for_chunk(idx, width)
            return replaced_terms(self.model, self.graph, values, width)

    def __call__(self, keeps: np.ndarray) -> np.ndarray:
        """Per-example metric ``[len(keeps), n]``."""
        model, graph, c = self.model, self.graph, self.c
        keep = torch.as_tensor(np.asarray(keeps, dtype=bool), device=c.tokens.device)
        out = torch.empty(keep.shape[0], len(c), dtype=torch.float64)
        # rows per forward: as asked, and no more than the writers' differences and one prefix of
        # them (each [rows, pos, writers, d_model]) fit in MEMORY_BUDGET
        P, W = c.tokens.shape[1], len(graph.writers)
        fit = max(1, MEMORY_BUDGET // (2 * W * P * self.model.cfg.d_model * 4 * graph.kv_split))
        chunk = max(1, min(len(c), self.rows, fit))
        per = max(1, min(self.rows, fit) // chunk)
        with eval_mode(model):
            for c0 in range(0, len(c), chunk):
                sl = slice(c0, c0 + chunk)
                repl = self.terms(torch.arange(len(c), device=c.tokens.device)[sl])
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

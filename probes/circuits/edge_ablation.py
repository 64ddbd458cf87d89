"""A circuit's metric with every edge outside it ablated: one forward per chunk of keep masks.

:func:`ablated_metric`: an ablated edge's reader reads the writer's term from another run (the
terms it is given, :func:`probes.circuits.evaluator.replaced_terms`) instead of the live one
(TransformerLens' ``faithfulness`` rule); under a norm after a writer's block the norm is
recomputed (:mod:`probes.circuits.post_norm`). :class:`probes.circuits.evaluator.EdgeEvaluator`
measures keep masks with it.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from probes.circuits.engine import (
    Run,
    forks,
    merge_hooks,
    reader_groups,
    to_fork,
    writer_chunks,
    writer_hooks,
    writer_term,
)
from probes.circuits.graph import Graph
from probes.circuits.post_norm import norm_inputs, post_norms

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["ablated_metric"]


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
    edits = _ReaderEdits(
        model, graph, repl, excl, ids, soft, (k, b, run.tokens.shape[1]), keep.requires_grad
    )
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

    def __init__(self, model, graph, repl, excl, ids, soft, shape, grad: bool = False):
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
        # depth order, so w never falls); keeping one per reader layer held O(layers^2) copies.
        # Without gradients every difference is written once into one buffer [k, b, P, W, d] and
        # a prefix that starts at writer 0 is a view of it (no copy per reader layer)
        self.prefix: tuple = (None, [], None)
        self.buf: Tensor | None = None
        self.buffered = not grad

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
            out = self.repl[:, :, c0 : c0 + n] - live.reshape(self.k, self.b, self.P, n, self.d)
            if self.buffered:
                if self.buf is None:
                    W = len(self.graph.writers)
                    self.buf = out.new_empty(self.k, self.b, self.P, W, self.d)
                self.buf[:, :, :, c0 : c0 + n] = out
                out = self.buf[:, :, :, c0 : c0 + n]
            self.diffs[name] = out
        return self.diffs[name]

    def linear(self, w: int) -> tuple[list[int], Tensor | None]:
        """The columns of the writers below ``w`` without a norm after them, and their differences
        ``[k, b, P, columns, d]`` (a view of the buffer, or concatenated once per prefix)."""
        if self.prefix[0] != w:
            self.prefix = (None, [], None)  # freed before the next one is built
            on = [c for c in self.chunks if c[1] < w and c[0] not in self.norms]
            cols = [j for _, c0, n in on for j in range(c0, c0 + n)]
            parts = [self.diff(*c) for c in on]
            if self.buffered and cols == list(range(len(cols))) and cols:
                self.prefix = (w, cols, self.buf[:, :, :, : len(cols)])
            else:
                self.prefix = (w, cols, torch.cat(parts, 3) if on else None)
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

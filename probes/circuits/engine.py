"""What attribution, path patching and circuits share: their inputs, their metrics, the per-head
forks, and one forward (and backward) through the model's own code that reads activations and
their gradients at named hooks.

Nothing here copies the forward: runs go through :meth:`HookedPETransformer.forward_unchecked`
with TransformerLens hooks; a writer's residual term is read at its hook (a head's is
``hook_z @ W_O[h]``, which is what the attention layer adds for that head). The inputs and the
metrics are in :mod:`probes.circuits.runs` (importable from here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from probes.circuits.graph import COMPONENTS, Graph
from probes.circuits.runs import METRICS, PerExample, Run, as_pair, as_run, pair_labels, resolve

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


# ---------------------------------------------------------------------------------------------
# the per-head forks (TransformerLens' use_split_qkv_input, use_hook_mlp_in)
# ---------------------------------------------------------------------------------------------
@contextmanager
def forks(model: ProbeModel, on: bool = True) -> Iterator[None]:
    """Turn on the per-head q/k/v input forks and ``hook_mlp_in`` (``use_attn_in`` off while they
    are), and give the caller's flags back afterwards, also on error."""
    cfg = model.cfg
    saved = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in, cfg.use_attn_in)
    if not on:
        yield
        return
    model.check_forks()  # a bridge: some architectures fork after the norm
    try:
        if saved[2]:
            model.set_use_attn_in(False)
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
        yield
    finally:
        model.set_use_split_qkv_input(saved[0])
        model.set_use_hook_mlp_in(saved[1])
        if saved[2]:
            model.set_use_attn_in(True)


@contextmanager
def no_forks(model: ProbeModel) -> Iterator[None]:
    """The per-head forks off for a block (restored after)."""
    cfg = model.cfg
    saved = (cfg.use_split_qkv_input, cfg.use_attn_in)
    setters = (model.set_use_split_qkv_input, model.set_use_attn_in)
    try:
        for setter, value in zip(setters, saved, strict=True):
            if value:
                setter(False)
        yield
    finally:
        for setter, value in zip(setters, saved, strict=True):
            if value:
                setter(True)


def attend_with(
    model: ProbeModel,
    layer: int,
    run: Run,
    resid: Tensor,
    kv_input: Tensor | None,
    component: str,
    delta: Tensor,
    names: Sequence[str],
) -> dict[str, Tensor]:
    """Layer ``layer``'s attention on ``resid`` (``[rows, pos, d]``; ``run``'s rows repeated to
    match) with ``delta`` added to the ``component`` input of every head, and only to it, by the
    block's own ``attention_inputs`` and ``attn``; returns the attention hooks ``names``
    (e.g. ``"hook_pattern"``, ``"hook_z"``). With ``kv_source="embed"`` a k/v delta goes into the
    layer-0 input ``kv_input`` that keys and values read. A model without those seams
    (``can_restart`` False: a bridge) runs its forward with ``resid`` put in at the layer's input
    and ``delta`` at the component's per-head fork (the forks must be on), stopped after the layer."""
    block = model.blocks[layer]
    reps = resid.shape[0] // len(run)
    tokens = run.tokens.repeat(reps, 1)
    kv = None if run.key_valid is None else run.key_valid.repeat(reps, 1)
    seen: dict[str, Tensor] = {}
    hooks = [
        (f"blocks.{layer}.attn.{n}", lambda x, hook, n=n: seen.__setitem__(n, x)) for n in names
    ]
    if not model.can_restart:
        return _attend_hooked(model, layer, tokens, kv, resid, component, delta, hooks, seen)
    kv_in = None if kv_input is None else kv_input.repeat(reps, 1, 1)
    with no_forks(model):
        ctx = model.context(tokens, kv, kv_in)
        inputs = list(block.attention_inputs(resid, ctx))
        i = COMPONENTS.index(component)
        if component != "q" and kv_in is not None:
            inputs[i] = block.attention_inputs(resid, model.context(tokens, kv, kv_in + delta))[i]
        else:
            inputs[i] = block.attention_inputs(resid + delta, ctx)[i]
        with model.hooks(fwd_hooks=hooks):
            block.attn(*inputs, ctx)
    return seen


class _Stop(Exception):
    """Raised by a hook once everything wanted has been read: the rest of the forward is skipped."""


def _attend_hooked(
    model: ProbeModel, layer, tokens, kv, resid, component, delta, hooks, seen
) -> dict[str, Tensor]:
    if not model.cfg.use_split_qkv_input:
        raise RuntimeError(
            "attend_with on a model without restart seams needs the per-head forks on (engine.forks)"
        )

    def stop_when_done(x, hook):
        raise _Stop

    hooks = [
        (f"blocks.{layer}.hook_resid_pre", lambda x, hook: resid),
        (f"blocks.{layer}.attn.hook_{component}_input", lambda x, hook: x + delta[:, :, None]),
        *hooks,
        (f"blocks.{layer}.hook_resid_post", stop_when_done),
    ]
    try:
        with model.hooks(fwd_hooks=hooks):
            model.forward_unchecked(tokens, kv)
    except _Stop:
        pass
    return seen


# ---------------------------------------------------------------------------------------------
# the ungrouped view of grouped key/value heads: a copy of each forward per query head of a group
# ---------------------------------------------------------------------------------------------
def merge_hooks(model: ProbeModel, split: int) -> list[tuple[str, Callable]]:
    """The hooks of a forward split for the ungrouped view (``split = graph.kv_split`` > 1): its
    rows run ``split`` times, stacked along the batch (``[split, rows]``), and copy ``j`` carries
    what query head ``g * split + j`` reads of key/value head ``g`` (:func:`to_fork`). At each
    layer's ``attn.hook_z`` every copy takes head ``h``'s output from copy ``h % split``, the one
    computed from head ``h``'s own k and v, so the copies agree again from there on. These go
    before any other hook at ``hook_z``; none where ``split`` is 1."""
    if split == 1:
        return []
    H = model.cfg.n_heads

    def merge(z: Tensor, hook) -> Tensor:
        zs = z.view(split, -1, *z.shape[1:])  # [split, rows, pos, heads, d_head]
        h = torch.arange(H, device=z.device)
        picked = zs[h % split, :, :, h]  # [heads, rows, pos, d_head]
        return picked.permute(1, 2, 0, 3).repeat(split, 1, 1, 1)

    return [(f"blocks.{layer}.attn.hook_z", merge) for layer in range(model.cfg.n_layers)]


def _kv_fork(name: str) -> bool:
    return name.endswith(("attn.hook_k_input", "attn.hook_v_input"))


def to_fork(x: Tensor, name: str, split: int) -> Tensor:
    """A term for reader hook ``name`` on one copy's rows (``[rows, pos, ...]``; one slot per query
    head at a k/v fork) laid out for a forward split ``split`` ways (:func:`merge_hooks`): query
    head ``g * split + j`` of a k/v fork goes to copy ``j``'s slot ``g``, any other term to every
    copy."""
    if split == 1:
        return x
    if not _kv_fork(name):
        return x.repeat(split, *[1] * (x.dim() - 1))
    b, p, H, d = x.shape
    x = x.view(b, p, H // split, split, d).permute(3, 0, 1, 2, 4)  # [split, b, p, kv heads, d]
    return x.reshape(split * b, p, H // split, d)


def from_fork(g: Tensor, name: str, split: int) -> Tensor:
    """A gradient at hook ``name`` of a split forward, back on one copy's rows: a k/v fork's copies
    as one slot per query head (the inverse of :func:`to_fork`), any other hook's copies summed
    (the copies are one function of the hook's value: the chain rule)."""
    if split == 1:
        return g
    g = g.view(split, -1, *g.shape[1:])
    if not _kv_fork(name):
        return g.sum(0)
    s, b, p, n, d = g.shape
    return g.permute(1, 2, 3, 0, 4).reshape(b, p, n * s, d)  # [b, p, query heads, d]


def writer_hooks(graph: Graph) -> list[str]:
    names = [graph.embed_hook]
    for layer in range(graph.n_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        if graph.has_mlp:
            names.append(f"blocks.{layer}.{graph.mlp_out_hook}")
    return names


def writer_chunks(graph: Graph) -> list[tuple[str, int, int]]:
    """``(writer hook, its first writer column, its number of writers)`` of every writer hook."""
    out, col = [], 0
    for name in writer_hooks(graph):
        n = graph.n_heads if name.endswith("hook_z") else 1
        out.append((name, col, n))
        col += n
    return out


def reader_groups(graph: Graph) -> list[tuple[str, list[int], int, bool]]:
    """``(hook, reader indices, writers read, per head)`` of every reader hook in graph order: a
    layer's q, k and v forks (one reader per head of the fork, in its order: per query head, and
    for k and v of a grouped model per key/value head), its MLP input, the readout. The writers a
    group reads are a prefix of the graph's writers, ``0 .. writers read - 1``."""
    out = []
    for layer in range(graph.n_layers):
        for c in COMPONENTS:
            out.append(
                (
                    f"blocks.{layer}.attn.hook_{c}_input",
                    [graph.reader_index(r) for r in graph.fork_readers(layer, c)],
                    True,
                )
            )
        if graph.has_mlp:
            out.append(
                (f"blocks.{layer}.{graph.mlp_in_hook}", [graph.reader_index(f"MLP{layer}")], False)
            )
    out.append(
        (f"blocks.{graph.n_layers - 1}.hook_resid_post", [graph.reader_index("logits")], False)
    )
    return [
        (hook, idx, int(np.flatnonzero(graph.valid[idx].any(0)).max()) + 1, per_head)
        for hook, idx, per_head in out
    ]


def reader_hooks(graph: Graph) -> list[str]:
    return [hook for hook, _, _, _ in reader_groups(graph)]


def writer_term(model: ProbeModel, name: str, act: Tensor) -> Tensor:
    """The residual terms ``[batch, pos, writers, d_model]`` of one writer hook's writers, from its
    activation: ``z_h W_O[h]`` per head at ``attn.hook_z``, the value itself at ``hook_embed`` or
    ``hook_mlp_out`` (one writer). Where a norm follows the block's attention or MLP these are the
    terms inside it (:mod:`probes.circuits.post_norm` maps them to the residual)."""
    if name.endswith("attn.hook_z"):
        return torch.einsum("bphd,hdm->bphm", act, model.blocks[int(name.split(".")[1])].attn.W_O)
    return act[:, :, None]


def contributions(
    model: ProbeModel, graph: Graph, acts: dict[str, Tensor], n_writers: int | None = None
) -> Tensor:
    """The residual terms of the first ``n_writers`` writers, ``[batch, pos, writers, d_model]``,
    from activations at :func:`writer_hooks` (see :func:`writer_term`)."""
    out = torch.cat([writer_term(model, name, acts[name]) for name in writer_hooks(graph)], dim=2)
    return out if n_writers is None else out[:, :, :n_writers]


# ---------------------------------------------------------------------------------------------
# one forward (and backward) at named hooks
# ---------------------------------------------------------------------------------------------
def capture(
    model: ProbeModel,
    run: Run,
    names: Sequence[str],
    *,
    metric: Callable[[Tensor], Tensor] | None = None,
    grad_names: Sequence[str] = (),
    replace: dict[str, Callable[[Tensor], Tensor]] | None = None,
    detach: Sequence[str] = (),
    repeat: int = 1,
    split: int = 1,
) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
    """Run the model's forward on ``run`` (its rows repeated ``repeat`` times), reading the
    activations at ``names``.

    With ``metric(logits) -> [rows]`` and ``grad_names``, also the gradient of the summed metric at
    each of those hooks (rows are independent, so row i's gradient is that of its own metric),
    through a zero tensor added there. ``replace[name](x)`` substitutes a hook's value;
    ``detach`` hooks let their value through but no gradient (GradDrop). ``split``: the
    ungrouped view's copies of the forward (:func:`merge_hooks`; activations and the metric are
    copy 0's, gradients per query head at a k/v fork, :func:`from_fork`). Returns
    ``(activations, gradients, per-row metric)``.
    """
    acts: dict[str, Tensor] = {}
    zeros: dict[str, Tensor] = {}
    replace = replace or {}
    wanted = set(names) | set(grad_names) | set(replace) | set(detach)
    rows = len(run) * repeat  # one copy's

    def hook(
        x: Tensor, hook, name: str
    ) -> Tensor:  # name: the one asked for (a bridge's hook.name is its own)
        if name in replace:
            x = to_fork(replace[name](x[:rows]), name, split)
        if name in grad_names:
            zeros[name] = torch.zeros_like(x, requires_grad=True)
            x = x + zeros[name]
        if name in names:
            acts[name] = x[:rows].detach()
        if name in detach:
            x = x.detach()
        return x

    tokens = run.tokens.repeat(repeat * split, 1)
    kv = None if run.key_valid is None else run.key_valid.repeat(repeat * split, 1)
    hooks = merge_hooks(model, split) + [(n, partial(hook, name=n)) for n in sorted(wanted)]
    with torch.set_grad_enabled(bool(grad_names)), model.hooks(fwd_hooks=hooks):
        logits = model.forward_unchecked(tokens, kv)[:rows]
        values = metric(logits) if metric is not None else logits.new_zeros(logits.shape[0])
        grads: dict[str, Tensor] = {}
        if grad_names:
            have = [n for n in grad_names if n in zeros]
            got = torch.autograd.grad(values.sum(), [zeros[n] for n in have], allow_unused=True)
            grads = {
                n: from_fork(torch.zeros_like(zeros[n]) if g is None else g, n, split)
                for n, g in zip(have, got)
            }
    return acts, grads, values.detach()


def mean_metric(
    model: ProbeModel, run: Run, fn: PerExample, good: Tensor, bad: Tensor, rows: int
) -> float:
    """The mean of ``fn`` over ``run``'s rows (no gradient)."""
    total = 0.0
    with torch.no_grad():
        for c0 in range(0, len(run), rows):
            part = run.rows(slice(c0, c0 + rows))
            logits = model.forward_unchecked(part.tokens, part.key_valid)
            total += float(fn(logits, good[c0 : c0 + rows], bad[c0 : c0 + rows]).double().sum())
    return total / len(run)


__all__ = [
    "METRICS",
    "PerExample",
    "Run",
    "as_pair",
    "attend_with",
    "as_run",
    "capture",
    "contributions",
    "forks",
    "from_fork",
    "mean_metric",
    "merge_hooks",
    "no_forks",
    "pair_labels",
    "reader_groups",
    "reader_hooks",
    "resolve",
    "to_fork",
    "writer_chunks",
    "writer_hooks",
]

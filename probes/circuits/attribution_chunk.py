"""One chunk of examples of attribution patching: the hooked runs and the summed estimates.

:func:`attribute_chunk` runs the base forward and backward (once per gradient variant: GradDrop's dropped
blocks, EAP-IG's interpolation steps) on a chunk of examples and returns the summed (not yet
averaged) scores of nodes and edges, summed over positions, per position or per span bin;
:func:`_qk_fix` is AtP*'s exact recomputation of the attention softmax for query and key edges.
:func:`probes.circuits.attribution.attribute` splits the examples into chunks and averages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from probes.circuits.alignment import align
from probes.circuits.engine import (
    Run,
    attend_with,
    capture,
    contributions,
    pair_labels,
    reader_groups,
    reader_hooks,
    writer_hooks,
)
from probes.circuits.graph import Graph
from probes.circuits.post_norm import norm_inputs, post_norms, through_norms
from probes.common.replace import filled

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def _binned(x: Tensor, bins: tuple[Tensor, int] | None) -> Tensor:
    """``x`` (``[b, p, ...]``) summed over the chunk into ``[..., bins]``: one bin per position
    (``bins`` None), or per span (``bins = (ids [b, p], n_spans)``)."""
    if bins is None:
        return x.sum(0).movedim(0, -1)
    ids, k = bins
    flat = x.reshape(-1, *x.shape[2:])
    return flat.new_zeros((k, *x.shape[2:])).index_add_(0, ids.reshape(-1), flat).movedim(0, -1)


def _node_by_pos(
    graph: Graph, delta: dict[str, Tensor], grads: dict[str, Tensor], bins=None
) -> Tensor:
    """``[writers, pos or span]`` sums over the chunk of ``delta . grad`` at each writer's hook."""
    e = graph.embed_hook
    rows = [_binned((delta[e] * grads[e]).sum(-1).double(), bins)[None]]
    for layer in range(graph.n_layers):
        z = f"blocks.{layer}.attn.hook_z"
        rows.append(_binned((delta[z] * grads[z]).sum(-1).double(), bins))
        if graph.has_mlp:
            m = f"blocks.{layer}.{graph.mlp_out_hook}"
            rows.append(_binned((delta[m] * grads[m]).sum(-1).double(), bins)[None])
    return torch.cat(rows)


def _edge_by_pos(graph: Graph, contrib: Tensor, grads: dict[str, Tensor], bins=None) -> Tensor:
    """``[readers, writers, pos or span]`` sums over the chunk of ``contribution . reader gradient``.
    Per span: the positions of each span (over the chunk's rows) as one contraction."""
    P = contrib.shape[1]
    K = P if bins is None else bins[1]
    out = contrib.new_zeros((len(graph.readers), len(graph.writers), K), dtype=torch.float64)
    rows = None if bins is None else [(bins[0].reshape(-1) == k).nonzero()[:, 0] for k in range(K)]
    flat = contrib.reshape(-1, *contrib.shape[2:])
    for hook, idx, nw, per_head in reader_groups(graph):
        g = grads[hook] if per_head else grads[hook][:, :, None]
        if rows is None:
            out[idx, :nw] = torch.einsum("bpwd,bprd->rwp", contrib[:, :, :nw], g).double()
            continue
        gf = g.reshape(-1, *g.shape[2:])
        for k, at in enumerate(rows):
            if len(at):
                out[idx, :nw, k] = torch.einsum("nwd,nrd->rw", flat[at, :nw], gf[at]).double()
    return out


def _qk_fix(
    model: ProbeModel,
    graph: Graph,
    base: Run,
    acts: dict,
    contrib: Tensor,
    gpat: list[dict],
    sign: float,
    rows: int,
):
    """Edges into q/k inputs with the softmax recomputed: ``{(layer, c): [variants, nw, H]}``, each
    ``sign * sum_b sum (A(x + sign * delta_w) - A(x)) . dm/dA`` per query head. The delta goes into
    every head of the fork at once; a query head's pattern reads its own key/value head only, so
    under grouped key/value heads query head ``h``'s entry is its share of the edge into its key/value
    head, and that edge is the sum over the group (:func:`attribute_chunk`); in the ungrouped view
    it is the edge into ``h``'s own k reader."""
    out = {}
    b = len(base)
    for layer in range(graph.n_layers):
        resid = acts[f"blocks.{layer}.hook_resid_pre"]
        kv_in = acts["blocks.0.hook_resid_pre"] if model.cfg.kv_source == "embed" else None
        # the unperturbed pattern by the same code path as the perturbed ones
        base_pattern = attend_with(
            model, layer, base, resid, kv_in, "q", torch.zeros_like(resid), ["hook_pattern"]
        )["hook_pattern"]
        for c in "qk":
            nw = (
                1
                if (graph.kv_embed and c == "k")
                else 1 + layer * (graph.n_heads + int(graph.has_mlp))
            )
            total = torch.zeros(
                len(gpat), nw, graph.n_heads, dtype=torch.float64, device=resid.device
            )
            step = max(1, rows // b)
            for w0 in range(0, nw, step):
                d = (
                    contrib[:, :, w0 : min(nw, w0 + step)].permute(2, 0, 1, 3) * sign
                )  # [k, b, p, d]
                k = d.shape[0]
                seen = attend_with(
                    model,
                    layer,
                    base,
                    resid.repeat(k, 1, 1),
                    kv_in,
                    c,
                    d.reshape(-1, *d.shape[2:]),
                    ["hook_pattern"],
                )
                dA = seen["hook_pattern"].view(k, b, *base_pattern.shape[1:]) - base_pattern[None]
                for v, g in enumerate(gpat):
                    gA = g[f"blocks.{layer}.attn.hook_pattern"]
                    total[v, w0 : w0 + k] = sign * torch.einsum("kbhqs,bhqs->kh", dA, gA).double()
            out[layer, c] = total
    return out


def attribute_chunk(
    model: ProbeModel,
    graph,
    clean: Run,
    other: Run | None,
    replaced: dict[str, Tensor | None] | None,
    *,
    mode,
    method,
    edges,
    steps,
    fn,
    rows,
    bins=None,
    sigma=None,
):
    """Summed (not yet averaged) scores of one chunk of examples, for each gradient variant.
    ``other``: the corrupt run's rows, or None for ablation: then ``replaced`` holds the
    Replacement's values for these rows at the writer hooks (:meth:`Replacement.for_chunk`), and
    ``mode`` is not ``"denoise"``. ``sigma``: the corrupt run read at each clean token's moved
    position (:func:`probes.circuits.alignment.align`). Where a norm follows a block, an edge's
    term goes through its Jacobian at the run whose gradient is read
    (:mod:`probes.circuits.post_norm`). ``method="hvp"`` has its own chunk,
    :func:`probes.circuits.attribution_hvp.hvp_chunk`."""
    W = writer_hooks(graph)
    R = reader_hooks(graph) if edges else []
    norms = post_norms(model, graph) if edges else {}
    good, bad = pair_labels(clean, other)
    sign = 1.0 if mode == "denoise" else -1.0
    base = other if mode == "denoise" else clean
    extra: list[str] = norm_inputs(norms)
    if method == "atp*":
        extra += [
            f"blocks.{layer}.{n}"
            for layer in range(graph.n_layers)
            for n in ("hook_resid_pre", "attn.hook_pattern")
        ]

    def metric(n_rep: int = 1):
        return lambda logits: fn(logits, good.repeat(n_rep), bad.repeat(n_rep))

    if method == "eap-ig":
        return [_eap_ig(model, graph, clean, other, W + R, metric, steps, rows, edges, bins)]
    a_clean = capture(model, clean, W)[0] if base is not clean else None
    if other is not None and base is not other:
        a_other = align(capture(model, other, W)[0], sigma)
    # atp*: GradDrop's variants, each with one block's outputs detached
    variants = [()] + (_dropped_blocks(graph) if method == "atp*" else [])
    results, patterns = [], []
    pattern_names = [n for n in extra if "pattern" in n]
    for drop in variants:  # one gradient at a time: the readers' gradients are large
        acts, g, _ = capture(
            model,
            base,
            [] if drop else W + extra,
            metric=metric(),
            grad_names=W + R + pattern_names,
            detach=drop,
            split=graph.kv_split if edges else 1,  # the ungrouped view's copies of a forward
        )
        if not drop:
            base_acts = acts
            if base is clean:
                a_clean = acts
            else:
                a_other, g = align(acts, sigma), align(g, sigma)
                base_acts = a_other
            if other is None:
                a_other = {n: filled(replaced[n], a_clean[n]) for n in W}
            delta = {n: a_clean[n] - a_other[n] for n in W}
        patterns.append({n: g.pop(n) for n in pattern_names})
        with torch.no_grad():
            results.append(_scores(graph, delta, g, edges, model, bins, base_acts))
        del g
    if method == "atp*":
        with torch.no_grad():
            contrib = _terms(model, graph, delta, base_acts)
            qk = _qk_fix(model, graph, base, base_acts, contrib, patterns, sign, rows)
        _put_qk(graph, results, qk)
    return results


def _dropped_blocks(graph: Graph) -> list[tuple[str, ...]]:
    """AtP*'s GradDrop: per layer, the hooks of that block's outputs, detached in one variant."""
    return [
        tuple(f"blocks.{layer}.{h}" for h in ("hook_attn_out", "hook_mlp_out"))
        for layer in range(graph.n_layers)
    ]


def _put_qk(graph: Graph, results: list[Tensor], qk: dict) -> None:
    """Replace each variant's linearised q/k edges by :func:`_qk_fix`'s (positions summed; a
    key/value head's the sum over its query heads), in place."""
    for v, e in enumerate(results):
        for (layer, c), t in qk.items():
            names = graph.fork_readers(layer, c)
            if len(names) < graph.n_heads:  # a key/value head: the sum over its query heads
                t = t.view(*t.shape[:2], len(names), -1).sum(-1)
            idx = [graph.reader_index(r) for r in names]
            e[idx, : t.shape[1]] = 0.0
            e[idx, : t.shape[1], 0] = t[v].T


def _eap_ig(model: ProbeModel, graph, clean, other, grad_names, metric, steps, rows, edges, bins):
    """EAP-IG's summed scores: the gradient at ``steps`` runs whose layer-0 input goes from the
    corrupt run's to the clean one's. Where a norm follows a block its Jacobian moves along the
    path too, so edges are scored at each step (a norm's Jacobian times the term, with that step's
    gradient) and summed; elsewhere the gradients are summed and scored once."""
    W = writer_hooks(graph)
    norms = post_norms(model, graph) if edges else {}
    a_clean, a_other = capture(model, clean, W)[0], capture(model, other, W)[0]
    delta = {n: a_clean[n] - a_other[n] for n in W}
    e_c, e_k = a_clean[graph.embed_hook], a_other[graph.embed_hook]
    with torch.no_grad():
        terms = contributions(model, graph, delta) if norms else None
    summed: dict[str, Tensor] = {}
    total = None
    split = graph.kv_split if edges else 1  # the ungrouped view: a copy per query head
    per = max(1, rows // (len(clean) * split))
    for s0 in range(0, steps, per):
        alpha = (
            torch.arange(s0 + 1, min(steps, s0 + per) + 1, device=e_c.device, dtype=e_c.dtype)
            / steps
        )
        m = len(alpha)
        interp = (e_k[None] + alpha[:, None, None, None] * (e_c - e_k)[None]).reshape(
            -1, *e_c.shape[1:]
        )
        acts, g, _ = capture(
            model,
            other,
            norm_inputs(norms),
            metric=metric(m),
            grad_names=grad_names,
            repeat=m,
            replace={graph.embed_hook: lambda x, interp=interp: interp},
            split=split,
        )
        if norms:  # rows are steps x examples: the contraction sums over both
            with torch.no_grad():
                lin = through_norms(norms, graph, terms.repeat(m, 1, 1, 1), acts, exact=False)
                at = None if bins is None else (bins[0].repeat(m, 1), bins[1])
                part = _edge_by_pos(graph, lin, g, at)
            total = part if total is None else total + part
            continue
        for n, t in g.items():
            t = t.view(m, -1, *t.shape[1:]).sum(0)
            summed[n] = t if n not in summed else summed[n] + t
    with torch.no_grad():
        if norms:
            return total / steps
        return _scores(graph, delta, {n: t / steps for n, t in summed.items()}, edges, model, bins)


def _terms(model: ProbeModel, graph, delta, at) -> Tensor:
    """The writers' residual term differences ``[b, pos, writers, d]``: through the Jacobian of a
    norm after their block, at the base run's ``at`` (:mod:`probes.circuits.post_norm`)."""
    terms = contributions(model, graph, delta)
    return through_norms(post_norms(model, graph), graph, terms, at, exact=False)


def _scores(graph, delta, grads, edges, model: ProbeModel, bins=None, at=None) -> Tensor:
    if not edges:
        return _node_by_pos(graph, delta, grads, bins)
    return _edge_by_pos(graph, _terms(model, graph, delta, at), grads, bins)

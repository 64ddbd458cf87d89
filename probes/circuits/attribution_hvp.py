"""Second-order edge attribution, ``attribute(granularity="edge", method="hvp")`` (issue 55,
item 4; after Zhang & Wang 2026, arXiv 2606.09899, as ``rank_heads(path="hvp")`` for heads).

An edge ``e = (writer s -> reader r)`` moves reader ``r``'s input, and only it, by
``D_e = (s's term in the target run) - (s's term in the base run)`` (readers are independent
variables of the edge graph: each reads its own fork). Write ``m(a)`` for the base run's metric
with every reader ``r`` moved by ``sum_s a_(s,r) D_(s,r)``, the ``a`` per example (and per span
with ``spans=``). The edge's effect ``m(a_e = 1) - m(0)`` is, to second order,
``g_e + q_e / 2`` with ``g_e = dm/da_e = grad_{x_r} m . D_e`` (AtP's term) and
``q_e = d2m/da_e2 = D_e^T H D_e``, ``H`` the Hessian of ``m`` in the reader inputs. ``q`` comes
from Hessian-vector products by double backward through the forked forward that AtP
differentiates: the edges (valid edges x spans, flat, reader-major) are dealt round-robin into
``steps`` probes, each holding seeded random signs ``v`` on its edges (one per example:
:func:`edge_probes`), every reader is moved by ``delta_r = sum_s v_(s,r) D_(s,r)`` and
``q_e = v_e (H v)_e`` (Hutchinson's diagonal estimator: exact where each probe holds one edge,
``steps`` = the number of edges x spans; otherwise the cross terms ``v_e v_e' D_e^T H D_e'`` of the
probe's other edges enter with random signs). One probe costs one forward, one backward and one
more; ``rows // examples`` probes share a pass.

The scores keep :mod:`probes.circuits.attribution`'s sign (``effect = m(a at its clean value) -
m(a at its other value)``): denoising (base the corrupt run, target the clean) ``g + q / 2``;
noising and ablation (base the clean run, target the other value) ``-(g + q / 2)``. ``meta``
holds ``"first_order"`` (AtP's score), ``"second_order"`` (the part ``q / 2`` adds, signed as the
score), ``"reliability"`` (``|second_order| / |first_order|``, of the means over examples) and
``"flagged"`` (reliability above 1: the series has not settled, check the edge exactly), each
``[readers, writers]`` (with ``spans=``, summed over the spans as ``scores`` are: each
``(edge, span)`` is its own unit and the curvature between spans is left out; ``by_span`` holds
the units' estimates).

Where a norm follows the writer's block (Gemma 2 and 3, OLMo 2) the edge is defined as it acts,
:mod:`probes.circuits.post_norm`: reader ``r`` reads ``N(S + sum_s a_(s,r) t_s) - N(S)`` from that
block (``S`` the base run's), so ``g`` is the Jacobian linearisation and ``q`` the exact ablation's
second derivative, the norm's own curvature included. The ungrouped view of grouped key/value
heads runs ``graph.kv_split`` copies of each forward (:func:`probes.circuits.engine.merge_hooks`).
Not available: node granularity, ``by_position`` and ``aligned`` (refused in one line).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from probes.circuits.engine import (
    capture,
    contributions,
    merge_hooks,
    pair_labels,
    reader_groups,
    to_fork,
    writer_chunks,
    writer_hooks,
)
from probes.circuits.graph import Graph
from probes.circuits.post_norm import norm_inputs, post_norms
from probes.common.replace import filled

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel
    from probes.circuits.runs import Run

__all__ = ["check_hvp", "edge_probes", "hvp_chunk", "hvp_meta", "moved_metric"]


def check_hvp(granularity: str, by_position: bool) -> None:
    """The views ``method="hvp"`` has: edges, whole or per span (one-line ``ValueError``)."""
    if granularity != "edge":
        raise ValueError(
            "attribute: method='hvp' scores edges (granularity='edge'); a node's second-order "
            "term is not the sum of its edges'"
        )
    if by_position:
        raise ValueError(
            "attribute: by_position is not available with method='hvp' (pass spans= for edges "
            "per span)"
        )


def edge_probes(n: int, graph: Graph, n_bins: int, steps: int, seed: int) -> tuple[Tensor, Tensor]:
    """``(signs [n, readers, writers, bins], probe [readers, writers, bins])``: a seeded random
    sign per example and unit (valid edge x bin; 0 elsewhere), the same whatever the chunking,
    and the probe each unit belongs to (unit ``i``, flat and reader-major, is in probe
    ``i % steps``; -1 off the graph). ``steps`` above the number of units is refused."""
    R, W = graph.valid.shape
    valid = torch.as_tensor(graph.valid)[..., None].expand(R, W, n_bins).reshape(-1)
    units = valid.nonzero()[:, 0]
    if steps > len(units):
        raise ValueError(
            f"attribute: method='hvp' deals {len(units)} edges{' x spans' if n_bins > 1 else ''} "
            f"into steps probes: steps must be at most {len(units)}, got {steps}"
        )
    g = torch.Generator().manual_seed(seed)
    signs = torch.zeros(n, R * W * n_bins, dtype=torch.float64)
    signs[:, units] = torch.randint(0, 2, (n, len(units)), generator=g).double() * 2 - 1
    probe = torch.full((R * W * n_bins,), -1, dtype=torch.long)
    probe[units] = torch.arange(len(units)) % steps
    return signs.view(n, R, W, n_bins), probe.view(R, W, n_bins)


def _moves(model: ProbeModel, graph: Graph, clean: Run, other: Run | None, replaced, mode: str):
    """``(base run, D [b, pos, writers, d] inside any norm, the base run's norm inputs)``: what
    each writer's term moves by, from the base run to the target (module docstring)."""
    W = writer_hooks(graph)
    norms = post_norms(model, graph)
    base, target = (other, clean) if mode == "denoise" else (clean, other)
    at = capture(model, base, W + norm_inputs(norms))[0]
    to = capture(model, target, W)[0] if target is not None else None
    if to is None:  # ablation: the Replacement's values for these rows
        to = {n: filled(replaced[n], at[n]) for n in W}
    with torch.no_grad():
        terms = contributions(model, graph, {n: to[n] - at[n] for n in W})
    return base, terms, {n: at[n] for n in norm_inputs(norms)}


def _edit(x, hook, *, name, idx, nw, per_head, a, terms, at, ids, norms, graph):
    """Reader hook ``name``'s input plus ``sum_s a_(s,r) D_(s,r)`` for its readers ``idx``
    (``a``: ``[P, b, readers, writers, bins]``, the copies of the chunk stacked as ``[P, b]``)."""
    P, b = a.shape[:2]
    sel = a[:, :, idx, :nw]  # [P, b, r, w, K]
    if sel.shape[-1] == 1:
        mix = lambda t, s: torch.einsum("bpwd,qbrw->qbprd", t, s[..., 0])  # noqa: E731
    else:  # each position's span: [P, b, r, w, pos]
        sel = sel.gather(-1, ids[None, :, None, None, :].expand(*sel.shape[:4], ids.shape[1]))
        mix = lambda t, s: torch.einsum("bpwd,qbrwp->qbprd", t, s)  # noqa: E731
    add = None
    for hook_name, c0, n in writer_chunks(graph):
        if c0 >= nw:
            break
        t = mix(terms[:, :, c0 : c0 + n], sel[:, :, :, c0 : c0 + n])  # [P, b, pos, r, d]
        if hook_name in norms:  # inside the norm, recomputed (post_norm)
            norm = norms[hook_name]
            s = at[norm.hook_in][None, :, :, None]
            t = norm.norm(s + t) - norm.norm(s)
        add = t if add is None else add + t
    p, d = add.shape[2], add.shape[-1]
    add = add.reshape(P * b, p, len(idx), d) if per_head else add.reshape(P * b, p, d)
    return x + to_fork(add, name, graph.kv_split)


def moved_metric(model, graph, base: Run, terms, at, a: Tensor, metric, ids=None) -> Tensor:
    """The metric ``[P * b]`` of the base run with every reader moved by ``sum_s a_(s,r) D_(s,r)``
    (``a``: ``[P, b, readers, writers, bins]``; ``ids`` ``[b, pos]`` the span of each position
    where ``bins`` > 1): the function whose derivatives in ``a`` :func:`hvp_chunk` takes."""
    P = a.shape[0]
    split = graph.kv_split
    norms = post_norms(model, graph)
    edit = partial(_edit, a=a, terms=terms, at=at, ids=ids, norms=norms, graph=graph)
    hooks = merge_hooks(model, split) + [
        (h, partial(edit, name=h, idx=idx, nw=nw, per_head=ph))
        for h, idx, nw, ph in reader_groups(graph)
    ]
    # a hooked pattern makes the attention eager, and SDPA's math kernel has a double backward
    hooks += [
        (f"blocks.{layer}.attn.hook_pattern", lambda x, hook: x) for layer in range(graph.n_layers)
    ]
    tokens = base.tokens.repeat(P * split, 1)
    kv = None if base.key_valid is None else base.key_valid.repeat(P * split, 1)
    with sdpa_kernel(SDPBackend.MATH), model.hooks(fwd_hooks=hooks):
        logits = model.forward_unchecked(tokens, kv)[: P * len(base)]
    return metric(logits, P)


def _probe_pass(model, graph, base, terms, at, ids, v: Tensor, metric) -> tuple[Tensor, Tensor]:
    """``g = dm/da`` ``[b, R, W, K]`` at ``a = 0`` and ``H v`` ``[P, b, R, W, K]`` for the probes
    ``v``: one forward of ``P`` copies of the chunk, a backward and one more."""
    a = torch.zeros(v.shape, dtype=terms.dtype, device=terms.device, requires_grad=True)
    with torch.enable_grad():
        m = moved_metric(model, graph, base, terms, at, a, metric, ids)
        (g,) = torch.autograd.grad(m.sum(), a, create_graph=True)  # rows are independent
        hv = None
        if g.requires_grad:  # else the metric is linear in a: no curvature
            (hv,) = torch.autograd.grad((g * v).sum(), a, allow_unused=True)
    hv = torch.zeros_like(a) if hv is None else hv
    return g.detach()[0].double().cpu(), hv.detach().double().cpu()


def hvp_chunk(
    model: ProbeModel, graph: Graph, clean, other, replaced, *, mode, fn, rows, bins, probes
) -> list[Tensor]:
    """One chunk's summed (not yet averaged) ``[estimate, first order, second order]``, each
    ``[readers, writers, bins]`` (module docstring). ``probes``: :func:`edge_probes`' signs for
    these rows and the probe of each unit; ``bins``: ``(span ids [b, pos], n_spans)`` or None."""
    signs, probe_of = probes
    steps = int(probe_of.max()) + 1
    good, bad = pair_labels(clean, other)
    base, terms, at = _moves(model, graph, clean, other, replaced, mode)
    b = len(base)
    ids = None if bins is None else bins[0]

    def metric(logits: Tensor, P: int) -> Tensor:
        return fn(logits, good.repeat(P), bad.repeat(P))

    per = max(1, rows // (b * graph.kv_split))  # probes a pass
    first, curvature = None, torch.zeros(signs.shape, dtype=torch.float64)
    for p0 in range(0, steps, per):
        mine = probe_of[None] == torch.arange(p0, min(steps, p0 + per))[:, None, None, None]
        v = signs[None] * mine[:, None]  # [P, b, R, W, K]
        g, hv = _probe_pass(model, graph, base, terms, at, ids, v.to(terms), metric)
        first = g if first is None else first
        curvature += (v * hv).sum(0)  # each unit is in one probe only
    sign = 1.0 if mode == "denoise" else -1.0
    first, second = sign * first.sum(0), sign * curvature.sum(0) / 2
    return [first + second, first, second]


def hvp_meta(totals: list[Tensor], n: int, graph: Graph) -> dict[str, np.ndarray]:
    """``meta``'s first- and second-order parts, reliability and flags ``[readers, writers]`` from
    :func:`hvp_chunk`'s summed totals (NaN, and not flagged, off the graph)."""
    first, second = (np.where(graph.valid, t.sum(-1).numpy() / n, np.nan) for t in totals[1:3])
    with np.errstate(divide="ignore", invalid="ignore"):
        reliability = np.abs(second) / np.maximum(np.abs(first), np.finfo(np.float64).tiny)
    return {
        "first_order": first,
        "second_order": second,
        "reliability": reliability,
        "flagged": np.where(graph.valid, reliability > 1, False),
    }

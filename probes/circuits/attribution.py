"""Attribution patching: first-order estimates of patching every node or edge, batched over
examples.

:func:`attribute` scores the graph of :mod:`probes.circuits.graph` (writers, and writer -> reader edges
with positions summed). For a node or edge with activation ``a``, every method estimates

    effect = m(with a at its clean value) - m(with a at its other value)

where "other" is the corrupt run's activation (``corrupt`` given), zero or the mean over a
reference set (``corrupt=None``: zero or mean ablation, so the effect is the drop the ablation
causes). The metric ``m`` is per example (``"logprob"`` of the clean label, ``"logit_diff"``
between the clean and the corrupt label, ``"logit"``, or ``fn(logits, clean_labels,
corrupt_labels) -> [n]``); scores are means over examples.

- ``"atp"`` (Nanda 2022; TransformerLens' ``attribution_patch``): ``(a_clean - a_other) . g`` with
  ``g`` the metric's gradient at the base run: the corrupt run (``direction="denoise"``, as
  TransformerLens) or the clean one (``"noise"``, and always for ablation). An edge's ``g`` is
  the gradient at the reader's input (its per-head fork), its delta the writer's residual term.
- ``"atp*"`` (Kramár et al. 2024, arXiv 2403.00745): for edges into a query or key input the
  attention softmax is recomputed exactly, by the model's own attention code with the writer's
  delta added to that input (at every position), and only the step from the attention pattern
  on is linearised: ``sum (A' - A) . dm/dA``. Node scores are the sums of their edges (for
  ``"atp"`` that sum is the node score exactly). GradDrop: the same estimate with the gradient
  through block ``l``'s output (``hook_attn_out``, ``hook_mlp_out``) dropped, for each ``l``;
  ``magnitude = sum_l |estimate_l| / (L - 1)`` (of the means over examples) catches effects that
  cancel between paths. Dropping a node's own block zeroes its estimate, hence ``L - 1``; nothing
  zeroes the embedding's or an edge into the readout, so those divide by ``L`` (a choice made
  here: Kramár et al. define GradDrop for nodes that sit in a layer). ``scores`` holds the signed
  estimate without GradDrop.
- ``"eap-ig"`` (Hanna et al. 2024): the gradient averaged over ``steps`` runs whose token
  embedding goes from corrupt to clean, ``corrupt + k/steps (clean - corrupt)``, ``k = 1..steps``.

**σ-aligned** (``aligned=True``, ``"atp"`` on position-only pairs, where the corrupt row holds the
clean row's tokens moved, ``x'[σ(i)] = x[i]``): the corrupt run is read at ``σ(i)``, each clean
token's own moved position, for both the activation and (denoising) the gradient, so the estimate
is that of patching the clean value of token ``i`` into the corrupt run where that token sits. At
a fixed index a position-only pair changes the token a unit sees, and a unit blind to position
then scores as if it carried position; aligned, its two values are equal and it scores 0 (to float
rounding: the moved keys are summed in another order).

Where the metric is linear in the activation between the two values (a readout without a final
norm; a value input of the last layer of a model without norms or MLPs; a query or key input
there for ``"atp*"``) the estimate is the exact effect, and ``tests/test_attribution.py`` holds
it to exact patching there and to TransformerLens' ``attribution_patch`` everywhere.
"""

from __future__ import annotations

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
    attend_with,
    capture,
    contributions,
    forks,
    mean_metric,
    pair_labels,
    reader_groups,
    reader_hooks,
    resolve,
    writer_hooks,
)
from probes.circuits.graph import Graph, build_graph, head_name, parse
from probes.circuits.scores import Attribution, span_ids
from probes.inputs import FiniteWatch, check_count, check_finite_model, takes_probe_model
from probes.options import ATTRIBUTION_ABLATIONS, ATTRIBUTION_METHODS
from probes.replace import position_means

METHODS = ATTRIBUTION_METHODS
GRANULARITIES = ("node", "edge")
ABLATIONS = ATTRIBUTION_ABLATIONS
DIRECTIONS = ("denoise", "noise")


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
            m = f"blocks.{layer}.hook_mlp_out"
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
    model,
    graph: Graph,
    base: Run,
    acts: dict,
    contrib: Tensor,
    gpat: list[dict],
    sign: float,
    rows: int,
):
    """Edges into q/k inputs with the softmax recomputed: ``{(layer, c): [variants, nw, H]}``, each
    ``sign * sum_b sum (A(x + sign * delta_w) - A(x)) . dm/dA``."""
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


def _chunk(
    model,
    graph,
    clean: Run,
    other: Run | None,
    means,
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
    ``sigma``: the corrupt run read at each clean token's moved position (:func:`probes.circuits.alignment.align`)."""
    W = writer_hooks(graph)
    R = reader_hooks(graph) if edges else []
    good, bad = pair_labels(clean, other)
    sign = 1.0 if mode == "denoise" else -1.0
    base = other if mode == "denoise" else clean
    extra: list[str] = []
    if method == "atp*":
        extra = [
            f"blocks.{layer}.{n}"
            for layer in range(graph.n_layers)
            for n in ("hook_resid_pre", "attn.hook_pattern")
        ]

    def metric(n_rep: int = 1):
        return lambda logits: fn(logits, good.repeat(n_rep), bad.repeat(n_rep))

    a_clean = capture(model, clean, W)[0] if base is not clean else None
    if other is not None and base is not other:
        a_other = align(capture(model, other, W)[0], sigma)
    variants = [()] + (
        [
            tuple(f"blocks.{layer}.{h}" for h in ("hook_attn_out", "hook_mlp_out"))
            for layer in range(graph.n_layers)
        ]
        if method == "atp*"
        else []
    )
    if method == "eap-ig":
        a_clean, a_other = capture(model, clean, W)[0], capture(model, other, W)[0]
        e_c, e_k = a_clean[graph.embed_hook], a_other[graph.embed_hook]
        summed: dict[str, Tensor] = {}
        per = max(1, rows // len(clean))
        for s0 in range(0, steps, per):
            alpha = (
                torch.arange(s0 + 1, min(steps, s0 + per) + 1, device=e_c.device, dtype=e_c.dtype)
                / steps
            )
            m = len(alpha)
            interp = (e_k[None] + alpha[:, None, None, None] * (e_c - e_k)[None]).reshape(
                -1, *e_c.shape[1:]
            )
            _, g, _ = capture(
                model,
                other,
                [],
                metric=metric(m),
                grad_names=W + R,
                repeat=m,
                replace={graph.embed_hook: lambda x, interp=interp: interp},
            )
            for n, t in g.items():
                t = t.view(m, -1, *t.shape[1:]).sum(0)
                summed[n] = t if n not in summed else summed[n] + t
        delta = {n: a_clean[n] - a_other[n] for n in W}
        with torch.no_grad():
            return [
                _scores(graph, delta, {n: t / steps for n, t in summed.items()}, edges, model, bins)
            ]
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
        )
        if not drop:
            base_acts = acts
            if base is clean:
                a_clean = acts
            else:
                a_other, g = align(acts, sigma), align(g, sigma)
            if other is None:
                a_other = {
                    n: (
                        torch.zeros_like(a_clean[n])
                        if mode == "zero"
                        else means[n][None, : a_clean[n].shape[1]].expand_as(a_clean[n])
                    )
                    for n in W
                }
            delta = {n: a_clean[n] - a_other[n] for n in W}
        patterns.append({n: g.pop(n) for n in pattern_names})
        with torch.no_grad():
            results.append(_scores(graph, delta, g, edges, model, bins))
        del g
    if method == "atp*":
        with torch.no_grad():
            contrib = contributions(model, graph, delta)
            qk = _qk_fix(model, graph, base, base_acts, contrib, patterns, sign, rows)
        for v, e in enumerate(results):  # replace the linearised q/k edges (positions summed)
            for (layer, c), t in qk.items():
                idx = [
                    graph.reader_index(f"{head_name(layer, h)}.{c}") for h in range(graph.n_heads)
                ]
                e[idx, : t.shape[1]] = 0.0
                e[idx, : t.shape[1], 0] = t[v].T
    return results


def _scores(graph, delta, grads, edges, model, bins=None) -> Tensor:
    if not edges:
        return _node_by_pos(graph, delta, grads, bins)
    return _edge_by_pos(graph, contributions(model, graph, delta), grads, bins)


@takes_probe_model
def attribute(
    model,
    clean: Any,
    corrupt: Any = None,
    *,
    granularity: str = "node",
    method: str = "atp",
    steps: int = 8,
    metric: Any = "logprob",
    ablation: str = "zero",
    reference: Any = None,
    direction: str = "denoise",
    by_position: bool = False,
    spans: Any = None,
    span_names: Any = None,
    aligned: bool = False,
    batch_size: int | None = None,
) -> Attribution:
    """Attribution scores of every node (``granularity="node"``) or edge (``"edge"``).

    ``clean`` is a ``Batch`` or ``CounterfactualPairs`` (then ``corrupt`` is its corrupt side);
    ``corrupt`` a ``Batch`` with the same shape, or None for ``ablation="zero"|"mean"`` (means per
    position over ``reference``, default the clean batch). ``steps``: EAP-IG's integration steps.
    ``by_position`` keeps a last axis of positions (``"atp"``, ``"eap-ig"``). ``spans``: each
    clean example's span per position (``[n, pos]`` ids into ``span_names``, e.g.
    ``task.spans(pairs.clean)``) adds ``by_span``, each span's positions summed per example
    (``"atp"``, ``"eap-ig"``). ``aligned`` (``"atp"``, position-only pairs): each clean token's
    activation is compared with the corrupt run's at that token's moved position, not at the same
    index, so that a unit blind to position scores 0 (module docstring). ``batch_size``:
    most rows per forward (examples x steps or x writers). See the module docstring."""
    for name, value, allowed in (
        ("method", method, METHODS),
        ("granularity", granularity, GRANULARITIES),
        ("ablation", ablation, ABLATIONS),
        ("direction", direction, DIRECTIONS),
    ):
        if value not in allowed:
            raise ValueError(
                f"attribute: {name} must be one of {', '.join(map(repr, allowed))}; got {value!r}"
            )
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"attribute: steps must be a positive integer, got {steps!r}")
    if batch_size is not None:
        check_count(batch_size, "batch_size", 1, "attribute")
    check_finite_model(model, "attribute")
    graph = build_graph(model.cfg)
    c, k = as_pair(model, clean, corrupt, "attribute")
    if method == "eap-ig" and k is None:
        raise ValueError(
            "attribute: method='eap-ig' integrates from the corrupt input to the clean one; pass corrupt= (or use 'atp'/'atp*' for ablation)"
        )
    if method == "eap-ig" and not torch.equal(c.pad_mask, k.pad_mask):
        raise ValueError(
            "attribute: method='eap-ig' needs clean and corrupt rows with the same pad_mask"
        )
    if method == "atp*" and (by_position or spans is not None):
        raise ValueError(
            "attribute: by_position and spans are not available with method='atp*' (its key fix patches every position at once)"
        )
    if by_position and spans is not None:
        raise ValueError("attribute: pass by_position or spans, not both")
    ids, names = (
        (None, ()) if spans is None else span_ids(spans, span_names, c.tokens.shape, "attribute")
    )
    if aligned and method != "atp":
        raise ValueError(
            f"attribute: aligned=True is for method='atp' (a position-only pair's aligned inputs are equal, "
            f"so there is no path for {method!r} to integrate or recompute)"
        )
    sigma = moved(c, k, "attribute") if aligned else None
    if method == "atp*" and graph.n_layers < 2:
        raise ValueError(
            "attribute: method='atp*' (GradDrop over layers) needs a model with at least 2 layers"
        )
    mode = direction if k is not None else ablation
    metric_name, fn = resolve(metric)
    watch = FiniteWatch()  # every logit the metric sees, checked once at the end
    fn = watch.wrap(fn)
    edges = granularity == "edge" or method == "atp*"
    rows = batch_size or (256 if model.W_E.device.type == "cpu" else 4096)
    cfg = model.cfg
    # examples per chunk: the forked forward keeps ~[pos, heads, d_model] per reader hook and example
    per_example = (
        c.tokens.shape[1] * cfg.d_model * (3 * cfg.n_heads + 2) * cfg.n_layers * 8 if edges else 0
    )
    chunk = max(1, min(rows, int(2e8 // per_example))) if edges else rows
    n, P = len(c), c.tokens.shape[1]
    with eval_mode(model), forks(model, on=edges):
        means = None
        if k is None and ablation == "mean":
            ref = (
                c
                if reference is None
                else as_run(model, reference, what="reference", who="attribute")
            )
            if ref.tokens.shape[1] < P:
                raise ValueError(
                    f"attribute: the reference is shorter ({ref.tokens.shape[1]}) than the examples ({P})"
                )
            means = position_means(model, ref.tokens, ref.pad_mask, writer_hooks(graph), rows)
        totals: list[Tensor] | None = None
        for c0 in range(0, n, chunk):
            sl = slice(c0, c0 + chunk)
            bins = None if ids is None else (ids[sl].to(c.tokens.device), len(names))
            part = _chunk(
                model,
                graph,
                c.rows(sl),
                None if k is None else k.rows(sl),
                means,
                mode=mode,
                method=method,
                edges=edges,
                steps=steps,
                fn=fn,
                rows=rows,
                bins=bins,
                sigma=None if sigma is None else sigma[sl],
            )
            totals = part if totals is None else [a + b for a, b in zip(totals, part)]
        good, bad = pair_labels(c, k)
        m_clean = mean_metric(model, c, fn, good, bad, rows)
        m_corrupt = float("nan") if k is None else mean_metric(model, k, fn, good, bad, rows)
    watch.check("attribute")
    per_pos = [t.cpu().numpy() / n for t in totals]
    if edges:
        mask = graph.valid[..., None]
        per_pos = [np.where(mask, t, np.nan) for t in per_pos]
    summed = [
        t.sum(-1) if not edges else np.where(graph.valid, np.nansum(t, -1), np.nan) for t in per_pos
    ]
    magnitude = None
    if method == "atp*":
        norm = np.full((len(graph.readers), 1), graph.n_layers - 1.0)
        norm[graph.reader_index("logits")] = graph.n_layers  # no dropped block zeroes the readout
        magnitude = sum(np.abs(s) for s in summed[1:]) / norm
    scores = summed[0]
    if edges and granularity == "node":  # atp*: a node is the sum of its edges
        scores = np.nansum(scores, axis=0)
        norm = np.full(len(graph.writers), graph.n_layers - 1.0)
        norm[0] = graph.n_layers  # the embedding is in no block
        magnitude = sum(np.abs(np.nansum(s, axis=0)) for s in summed[1:]) / norm
    return Attribution(
        method=method,
        granularity=granularity,
        mode=mode,
        metric=metric_name,
        writers=graph.writers,
        readers=graph.readers if granularity == "edge" else (),
        scores=scores,
        n_examples=n,
        n_layers=graph.n_layers,
        n_heads=graph.n_heads,
        steps=steps if method == "eap-ig" else 1,
        clean_metric=m_clean,
        corrupt_metric=m_corrupt,
        by_position=per_pos[0] if by_position else None,
        span_names=tuple(names),
        by_span=per_pos[0] if ids is not None else None,
        magnitude=magnitude,
        meta={
            "encoding": model.cfg.encoding_name,
            "kv_source": model.cfg.kv_source,
            **({"aligned": True} if aligned else {}),
        },
    )


__all__ = [
    "ABLATIONS",
    "DIRECTIONS",
    "GRANULARITIES",
    "METHODS",
    "Attribution",
    "attribute",
    "parse",
    "span_ids",
]

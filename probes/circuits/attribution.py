"""Attribution patching: first-order estimates of patching every node or edge, batched over
examples.

:func:`attribute` scores the graph of :mod:`probes.circuits.graph` (writers, and writer -> reader edges
with positions summed). For a node or edge with activation ``a``, every method estimates

    effect = m(with a at its clean value) - m(with a at its other value)

where "other" is the corrupt run's activation (``corrupt`` given), or with ``corrupt=None`` what
the :class:`probes.common.replace.Replacement` that ``ablation`` names puts at the writer hooks:
zero or the mean over a reference set (zero or mean ablation, so the effect is the drop the
ablation causes; :func:`probes.circuits.evaluator.edge_replacement` builds it once). The
metric ``m`` is per example (``"logprob"`` of the clean label, ``"logit_diff"`` between the clean
and the corrupt label, ``"logit"``, or ``fn(logits, clean_labels, corrupt_labels) -> [n]``);
scores are means over examples.

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
- ``"hvp"`` (edges; after arXiv 2606.09899): AtP plus the second-order term ``D^T H D / 2`` of each
  edge, ``H`` the Hessian in the reader inputs, from Hessian-vector products with ``steps``
  Hutchinson probes of seeded signs (``seed``); ``meta`` adds the first- and second-order parts,
  each edge's reliability and the flagged edges (:mod:`probes.circuits.attribution_hvp`).

**σ-aligned** (``aligned=True``, ``"atp"`` on position-only pairs, where the corrupt row holds the
clean row's tokens moved, ``x'[σ(i)] = x[i]``): the corrupt run is read at ``σ(i)``, each clean
token's own moved position, for both the activation and (denoising) the gradient, so the estimate
is that of patching the clean value of token ``i`` into the corrupt run where that token sits. At
a fixed index a position-only pair changes the token a unit sees, and a unit blind to position
then scores as if it carried position; aligned, its two values are equal and it scores 0 (to float
rounding: the moved keys are summed in another order).

Under grouped (and multi-query) key/value heads an edge into a key/value head's k or v reader
(``"L1KV0.k"``) is the writer's term added to that key/value head's fork, which every query head of
its group reads: its AtP and EAP-IG gradients are the fork's own, and AtP* recomputes the pattern of
each query head of the group and sums them (``tests/test_bridge_gqa_edges.py``). ``kv_view=
"ungrouped"`` scores an edge into each query head's own copy of its key/value head's input
(``"L1H2.k"``; :mod:`probes.circuits.graph`): its gradient is the one through that query head alone,
from a forward run once per query head of a group (:func:`probes.circuits.engine.merge_hooks`), so
the query heads' scores sum to their key/value head's (``tests/test_bridge_ungrouped_edges.py``).

Where a norm follows a block's attention or MLP (Gemma 2 and 3, OLMo 2) a writer's term is read
inside it and an edge's term difference goes through the norm's Jacobian at the run whose gradient
is read (each step's, for EAP-IG; ``meta["post_norm"] = "jacobian"``): an edge's AtP score is then
the derivative of the exact edge ablation, which recomputes the norm
(:mod:`probes.circuits.post_norm`; ``tests/test_post_norm_edges.py``).

Where the metric is linear in the activation between the two values (a readout without a final
norm; a value input of the last layer of a model without norms or MLPs; a query or key input
there for ``"atp*"``) the estimate is the exact effect, and ``tests/test_attribution.py`` holds
it to exact patching there and to TransformerLens' ``attribution_patch`` everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from pe_interp.util.modes import eval_mode
from probes.circuits.alignment import moved
from probes.circuits.attribution_chunk import attribute_chunk
from probes.circuits.attribution_hvp import check_hvp, edge_probes, hvp_chunk, hvp_meta
from probes.circuits.engine import as_pair, forks, mean_metric, pair_labels, resolve
from probes.circuits.evaluator import edge_replacement
from probes.circuits.graph import build_graph, check_kv_view, parse
from probes.circuits.post_norm import LINEARISATION, post_norms
from probes.circuits.scores import Attribution, span_ids
from probes.common.inputs import FiniteWatch, check_count, check_finite_model, takes_probe_model
from probes.common.options import ATTRIBUTION_ABLATIONS, ATTRIBUTION_METHODS

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

METHODS = ATTRIBUTION_METHODS
GRANULARITIES = ("node", "edge")
ABLATIONS = ATTRIBUTION_ABLATIONS
DIRECTIONS = ("denoise", "noise")


@takes_probe_model
def attribute(
    model: ProbeModel,
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
    kv_view: str = "grouped",
    progress: bool | str = False,
    seed: int = 0,
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
    most rows per forward (examples x steps or x writers). ``kv_view``: ``"ungrouped"`` gives
    grouped key/value heads a k and a v reader per query head (edges). ``progress``: a bar over the
    pairs with an ETA on stderr (a string: its label). ``"hvp"``: ``steps`` probes, their signs
    drawn from ``seed``. See the module docstring."""
    _check_options(method, granularity, ablation, direction, steps, batch_size, kv_view)
    _check_views(method, granularity, by_position, spans, aligned)
    check_finite_model(model, "attribute")
    graph = build_graph(model.cfg, kv_view)
    c, k = as_pair(model, clean, corrupt, "attribute")
    _check_pair(method, c, k, graph)
    ids, names = (
        (None, ()) if spans is None else span_ids(spans, span_names, c.tokens.shape, "attribute")
    )
    sigma = moved(c, k, "attribute") if aligned else None
    n = len(c)
    probes = edge_probes(n, graph, len(names) or 1, steps, seed) if method == "hvp" else None
    mode = direction if k is not None else ablation
    metric_name, fn = resolve(metric)
    watch = FiniteWatch()  # every logit the metric sees, checked once at the end
    fn = watch.wrap(fn)
    edges = granularity == "edge" or method in ("atp*", "hvp")
    rows = batch_size or (256 if model.W_E.device.type == "cpu" else 4096)
    chunk = _chunk(model, graph, c.tokens.shape[1], rows, edges)
    label = progress if isinstance(progress, str) else f"attribute ({method})"
    bar = tqdm(total=n, desc=label, unit="pairs", disable=not progress)
    with eval_mode(model), forks(model, on=edges), bar:
        repl = (  # ablation: what a unit moves towards (a pair's other side is its corrupt run)
            None
            if k is not None
            else edge_replacement(
                model, graph, ablation, c, None, reference=reference, rows=rows, who="attribute"
            )
        )
        bins = None if ids is None else (ids.to(c.tokens.device), len(names))
        totals = _sum_chunks(
            model,
            graph,
            (c, k, repl),
            chunk,
            bar,
            bins=bins,
            sigma=sigma,
            probes=probes,
            mode=mode,
            method=method,
            edges=edges,
            steps=steps,
            fn=fn,
            rows=rows,
        )
        good, bad = pair_labels(c, k)
        m_clean = mean_metric(model, c, fn, good, bad, rows)
        m_corrupt = float("nan") if k is None else mean_metric(model, k, fn, good, bad, rows)
    watch.check("attribute")
    per_pos, scores, magnitude = _summed(totals, n, graph, method, edges, granularity)
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
        steps=steps if method in ("eap-ig", "hvp") else 1,
        clean_metric=m_clean,
        corrupt_metric=m_corrupt,
        by_position=per_pos[0] if by_position else None,
        span_names=tuple(names),
        by_span=per_pos[0] if ids is not None else None,
        magnitude=magnitude,
        meta=_meta(model, graph, kv_view, aligned, edges, method, seed, totals, n),
    )


def _sum_chunks(model: ProbeModel, graph, runs, chunk, bar, *, bins, sigma, probes, **kw):
    """The chunks' summed scores (:func:`attribute_chunk`), ``chunk`` examples at a time:
    ``runs`` is ``(clean, corrupt or None, the Replacement or None)``, ``bins`` each example's
    span ids and their count, ``sigma`` the aligned positions, ``probes`` the hvp probes."""
    c, k, repl = runs
    n, P = len(c), c.tokens.shape[1]
    totals: list[Tensor] | None = None
    for c0 in range(0, n, chunk):
        sl = slice(c0, c0 + chunk)
        idx = torch.arange(n, device=c.tokens.device)[sl]
        runs = (c.rows(sl), None if k is None else k.rows(sl))
        replaced = None if repl is None else repl.for_chunk(idx, P)
        at = None if bins is None else (bins[0][sl], bins[1])
        if probes is not None:  # method "hvp": its own chunk
            hvp_kw = {n: kw[n] for n in ("mode", "fn", "rows")}
            part = hvp_chunk(
                model, graph, *runs, replaced, bins=at, probes=(probes[0][sl], probes[1]), **hvp_kw
            )
        else:
            sig = None if sigma is None else sigma[sl]
            part = attribute_chunk(model, graph, *runs, replaced, bins=at, sigma=sig, **kw)
        totals = part if totals is None else [a + b for a, b in zip(totals, part)]
        bar.update(len(idx))
    return totals


def _meta(model: ProbeModel, graph, kv_view, aligned, edges, method, seed, totals, n) -> dict:
    """The result's meta: the model's encoding and key/value source, the view, and what the
    method adds (hvp's parts and flags; how a norm after a block was crossed)."""
    return {
        "encoding": model.cfg.encoding_name,
        "kv_source": model.cfg.kv_source,
        "kv_view": kv_view,
        **({"aligned": True} if aligned else {}),
        **({"hvp_seed": seed, **hvp_meta(totals, n, graph)} if method == "hvp" else {}),
        # a norm after a block: how an edge's term went through it (post_norm.LINEARISATION)
        **({"post_norm": LINEARISATION} if edges and post_norms(model, graph) else {}),
    }


def _chunk(model: ProbeModel, graph, P: int, rows: int, edges: bool) -> int:
    """Examples per chunk: the forked forward keeps ~[pos, heads, d_model] per reader hook and
    example (and the ungrouped view a copy per query head of a group)."""
    if not edges:
        return rows
    cfg = model.cfg
    per_example = P * cfg.d_model * (3 * cfg.n_heads + 2) * cfg.n_layers * 8 * graph.kv_split
    return max(1, min(rows, int(2e8 // per_example)))


def _summed(totals: list[Tensor], n: int, graph, method: str, edges: bool, granularity: str):
    """``(per position, scores, magnitude)`` of the summed chunk scores: the mean per example,
    edges outside the graph NaN; AtP*'s magnitude the mean |score| over its dropped blocks."""
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
    return per_pos, scores, magnitude


def _check_options(method, granularity, ablation, direction, steps, batch_size, kv_view) -> None:
    """:func:`attribute`'s options, each one of its choices, in one line before any work."""
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
    check_kv_view(kv_view, "attribute")


def _check_views(
    method: str, granularity: str, by_position: bool, spans: Any, aligned: bool
) -> None:
    """The per-position, per-span and aligned views the ``method`` has."""
    if method == "atp*" and (by_position or spans is not None):
        raise ValueError(
            "attribute: by_position and spans are not available with method='atp*' (its key fix patches every position at once)"
        )
    if method == "hvp":
        check_hvp(granularity, by_position)
    if by_position and spans is not None:
        raise ValueError("attribute: pass by_position or spans, not both")
    if aligned and method != "atp":
        raise ValueError(
            f"attribute: aligned=True is for method='atp' (a position-only pair's aligned inputs are equal, "
            f"so there is no path for {method!r} to integrate or recompute)"
        )


def _check_pair(method: str, c, k, graph) -> None:
    """What ``method`` needs of the runs and the model: EAP-IG a corrupt run with the clean
    run's pad mask, AtP* two layers."""
    if method == "eap-ig" and k is None:
        raise ValueError(
            "attribute: method='eap-ig' integrates from the corrupt input to the clean one; pass corrupt= (or use 'atp'/'atp*' for ablation)"
        )
    if method == "eap-ig" and not torch.equal(c.pad_mask, k.pad_mask):
        raise ValueError(
            "attribute: method='eap-ig' needs clean and corrupt rows with the same pad_mask"
        )
    if method == "atp*" and graph.n_layers < 2:
        raise ValueError(
            "attribute: method='atp*' (GradDrop over layers) needs a model with at least 2 layers"
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

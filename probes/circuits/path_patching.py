"""Exact path patching of writer -> reader edges, batched over senders, receivers and examples.

:func:`path_patch` runs the corrupt input and adds one sender's clean-minus-corrupt residual term
(``z_h W_O[h]`` for a head, ``hook_mlp_out`` for an MLP, ``hook_embed``) to one receiver's
input alone, at every position, while every other reader still sees the corrupt value (where a
norm follows the sender's block, the term is replaced inside it and the norm recomputed on the
corrupt run's sum, :mod:`probes.circuits.post_norm`): the
edge intervention of TransformerLens' ``get_act_patch_direct_path`` (Wang et al. 2022), which
it equals for head senders and q/k/v receivers (``tests/test_path_patching.py``).

Receivers are heads (their ``component`` input: ``"q"``, ``"k"`` or ``"v"``; names ``"L1H3"`` or
``"L1H3.q"``), MLPs (``"MLP1"``, through ``hook_mlp_in``) and the readout (``"logits"``, the last
``hook_resid_post``).

How it is fast and still exact: both runs are cached once per chunk of examples; a receiver in
layer ``l`` is reached by running only layer ``l``'s attention (the model's own
``attention_inputs`` and ``attn``) with the sender's delta added to every head's fork at once
(a head's pattern and output depend on its own fork only), then each receiver head's patched
output replaces its corrupt one in the cached ``hook_resid_mid`` and the forward resumes there
(``forward_unchecked(..., start_at="resid_mid")``). MLP receivers resume at their layer's
``resid_mid`` with the delta added at ``hook_mlp_in``, the readout from the final residual.
Senders, receivers and examples share forwards as rows of one batch. A model without those
restart seams (``can_restart`` False: a TransformerLens bridge) runs each (sender, receiver) pair as
a whole corrupt forward with the delta added at the receiver's own hook, which is the definition
itself (``tests/test_path_patching.py`` holds the two paths equal on our model). So does the
ungrouped view of grouped key/value heads (``kv_view="ungrouped"``: a receiver ``"L1H3.k"`` is query
head 3's own copy of its key/value head's input), with a copy of the forward per query head of a
group (:func:`probes.circuits.engine.merge_hooks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pe_interp.config.model import KV_EMBED_NO_EDGES
from pe_interp.util.io import (
    load_result,
    nan_array,
    register_result,
    to_json,
    write_result,
)
from pe_interp.util.modes import eval_mode
from probes.circuits.engine import (
    as_pair,
    capture,
    contributions,
    forks,
    mean_metric,
    pair_labels,
    resolve,
    writer_hooks,
)
from probes.circuits.graph import COMPONENTS, build_graph, check_kv_view, head_name, parse
from probes.circuits.path_sites import site_hooked, site_restarted
from probes.circuits.post_norm import norm_inputs, post_norms, through_norms
from probes.common.inputs import FiniteWatch, check_count, check_finite_model, takes_probe_model

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

RESULT_KIND = register_result("path patching", "PathPatch.load", ("senders", "receivers", "values"))
_RESTARTS = ("hook_resid_pre", "hook_resid_mid")  # where a layer restarts from the cache


@dataclass(frozen=True, eq=False)
class PathPatch:
    """What :func:`path_patch` returns: ``values[s, r]`` is the mean metric with the edge
    ``senders[s] -> receivers[r]`` patched (NaN where there is no such edge); ``effects`` is
    that minus the corrupt run's metric."""

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    values: np.ndarray
    metric: str
    clean_metric: float
    corrupt_metric: float
    n_examples: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def effects(self) -> np.ndarray:
        return self.values - self.corrupt_metric

    def effect(self, sender: str, receiver: str) -> float:
        return float(self.effects[self.senders.index(sender), self.receivers.index(receiver)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "senders": list(self.senders),
            "receivers": list(self.receivers),
            "values": to_json(self.values),
            "metric": self.metric,
            "clean_metric": self.clean_metric,
            "corrupt_metric": self.corrupt_metric,
            "n_examples": self.n_examples,
            "meta": to_json(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PathPatch:
        return cls(
            tuple(d["senders"]),
            tuple(d["receivers"]),
            nan_array(d["values"]),
            d["metric"],
            float(d["clean_metric"]),
            float(d["corrupt_metric"]),
            int(d["n_examples"]),
            dict(d.get("meta") or {}),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=None, sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> PathPatch:
        return load_result(path, RESULT_KIND, cls.from_dict)


def _names(graph, senders, receivers, component: str) -> tuple[list[str], list[str]]:
    def sender(x: Any) -> str:
        return head_name(*x) if isinstance(x, tuple | list) else str(x)

    def receiver(x: Any) -> str:  # a head's input of ``component``: a key/value head's if grouped
        name = head_name(*x) if isinstance(x, tuple | list) else str(x)
        site = parse(name)
        return graph.reader_of(site.layer, site.head, component) if site.kind == "head" else name

    s = list(graph.writers) if senders is None else [sender(x) for x in senders]
    if receivers is None:
        r = [x for x in graph.readers if parse(x).kind != "input" or x.endswith(f".{component}")]
    else:
        r = [receiver(x) for x in receivers]
    for name in s:
        graph.writer_index(name)
    for name in r:
        graph.reader_index(name)
    if not s or not r:
        raise ValueError("path_patch: senders and receivers must be non-empty")
    if graph.kv_embed and senders is not None:
        kv = [x for x in r if parse(x).component in ("k", "v")]
        if kv and any(x != "embed" for x in s):
            raise ValueError(KV_EMBED_NO_EDGES)
    return s, r


@takes_probe_model
def path_patch(
    model: ProbeModel,
    clean: Any,
    corrupt: Any = None,
    senders: Any = None,
    receivers: Any = None,
    component: str = "q",
    *,
    metric: Any = "logit_diff",
    batch_size: int | None = None,
    kv_view: str = "grouped",
) -> PathPatch:
    """Patch each ``sender -> receiver`` edge alone (see the module docstring).

    ``clean``/``corrupt``: ``CounterfactualPairs``, or two ``Batch``es (or token tensors) of one
    shape. ``senders``: writer names (``"embed"``, ``"L0H3"``, ``"MLP0"``) or ``(layer, head)``;
    default every writer. ``receivers``: ``"L1H3"``/``(1, 3)`` (its ``component`` input),
    ``"L1H3.k"``, ``"MLP1"``, ``"logits"``; default every head (``component``), MLP and the
    readout. ``metric``: per example, as in :func:`probes.attribute`; values are means.
    ``kv_view``: ``"ungrouped"`` gives grouped key/value heads k/v receivers per query head.
    """
    check_kv_view(kv_view, "path_patch")
    _check_args(model, component, batch_size)
    graph = build_graph(model.cfg, kv_view)
    c, k = as_pair(model, clean, corrupt, "path_patch")
    if k is None:
        raise ValueError("path_patch: needs a corrupt run (pass CounterfactualPairs or corrupt=)")
    s_names, r_names = _names(graph, senders, receivers, component)
    metric_name, fn = resolve(metric)
    watch = FiniteWatch()  # every logit the metric sees, checked once at the end
    fn = watch.wrap(fn)
    good, bad = pair_labels(c, k)
    rows = batch_size or (256 if model.W_E.device.type == "cpu" else 4096)
    n, L = len(c), graph.n_layers
    s_idx = [graph.writer_index(x) for x in s_names]
    valid = graph.valid[[graph.reader_index(x) for x in r_names]][:, s_idx].T  # [S, R]
    sums = np.zeros(valid.shape)
    by_site: dict[tuple, list[int]] = {}
    for j, r in enumerate(r_names):
        site = parse(r)
        layer = L if site.kind == "logits" else site.layer
        by_site.setdefault((layer, site.kind, site.component), []).append(j)
    W = writer_hooks(graph)
    hooked = not model.can_restart or graph.kv_split > 1  # a bridge, or the ungrouped view's copies
    names = W if hooked else W + [f"blocks.{i}.{h}" for i in range(L) for h in _RESTARTS]
    names.append(f"blocks.{L - 1}.hook_resid_post")
    norms = post_norms(model, graph)
    assert hooked or not norms, "a restart at resid_mid adds a head's change with no norm after it"
    names += norm_inputs(norms)
    chunk = max(1, min(n, rows))
    with eval_mode(model), forks(model), torch.no_grad():
        for c0 in range(0, n, chunk):
            sl = slice(c0, c0 + chunk)
            cc, kk, g, b = c.rows(sl), k.rows(sl), good[sl], bad[sl]
            for ok, cols, out in _chunk(
                model, graph, cc, kk, W, names, s_idx, by_site, valid, r_names, fn, g, b, rows
            ):
                sums[np.ix_(ok, cols)] += out
        m_clean = mean_metric(model, c, fn, good, bad, rows)
        m_corrupt = mean_metric(model, k, fn, good, bad, rows)
    watch.check("path_patch")
    values = np.where(valid, sums / n, np.nan)
    return PathPatch(
        tuple(s_names),
        tuple(r_names),
        values,
        metric_name,
        m_clean,
        m_corrupt,
        n,
        {
            "encoding": model.cfg.encoding_name,
            "kv_source": model.cfg.kv_source,
            "kv_view": kv_view,
            **({"post_norm": "exact"} if norms else {}),  # the sender's norm recomputed
        },
    )


def _check_args(model: ProbeModel, component: str, batch_size: int | None) -> None:
    if component not in COMPONENTS:
        raise ValueError(
            f"path_patch: component must be one of {', '.join(COMPONENTS)}; got {component!r}"
        )
    if batch_size is not None:
        check_count(batch_size, "batch_size", 1, "path_patch")
    check_finite_model(model, "path_patch")


def _chunk(
    model: ProbeModel, graph, cc, kk, W, names, s_idx, by_site, valid, r_names, fn, g, b, rows
):
    """One chunk of examples, both runs cached: yields ``(senders, receiver columns, summed
    metric)`` per receiver site, in ``by_site``'s order, each before the next is computed."""
    hooked = not model.can_restart or graph.kv_split > 1  # a bridge, or the ungrouped view's copies
    a_clean = capture(model, cc, W)[0]
    a_cor = capture(model, kk, names)[0]
    delta = contributions(model, graph, {x: a_clean[x] - a_cor[x] for x in W})
    # a norm after the sender's block: N(S' + t - t') - N(S'), S' the corrupt run's (post_norm)
    delta = through_norms(post_norms(model, graph), graph, delta, a_cor, exact=True)
    delta = delta[:, :, s_idx]  # [b, p, S, d]
    for (layer, kind, comp), cols in by_site.items():
        ok = valid[:, cols].any(1).nonzero()[0]  # senders with an edge into some of these
        if not len(ok):
            continue
        receivers = [r_names[j] for j in cols]
        if hooked:
            out = site_hooked(
                model,
                graph,
                kk,
                delta,
                layer,
                kind,
                comp,
                receivers,
                ok,
                valid[np.ix_(ok, cols)],
                fn,
                g,
                b,
                rows,
            )
        else:
            out = site_restarted(
                model, kk, a_cor, delta, layer, kind, comp, receivers, ok, fn, g, b, rows
            )
        yield ok, cols, out


__all__ = ["PathPatch", "path_patch"]

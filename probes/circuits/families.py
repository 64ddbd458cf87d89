"""Every edge scored under each counterfactual family of a task (position, content), estimated
or exact, so that every edge (per span, position-aware) gets a positional and a content score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from probes.circuits.attribution import Attribution, attribute
from probes.circuits.graph import build_graph, check_kv_view, parse
from probes.common.inputs import takes_probe_model

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def exact_edges(
    model: ProbeModel,
    clean,
    corrupt=None,
    *,
    metric="margin",
    batch_size: int | None = None,
    kv_view: str = "grouped",
) -> Attribution:
    """Every edge's exact effect (:func:`probes.path_patch`, clean into corrupt) in the shape of an
    edge :class:`Attribution` (``method="path_patch"``), so that circuits and the agreement
    measures take exact and estimated scores alike; ``kv_view`` as :func:`probes.attribute`'s."""
    from probes.circuits.path_patching import path_patch

    check_kv_view(kv_view, "exact_edges")
    graph = build_graph(model.cfg, kv_view)
    scores = np.full(graph.valid.shape, np.nan)
    for comp in "qkv":
        receivers = [
            r for r in graph.readers if r.endswith(f".{comp}") or (comp == "q" and "." not in r)
        ]
        pp = path_patch(
            model,
            clean,
            corrupt,
            None,
            receivers,
            comp,
            metric=metric,
            batch_size=batch_size,
            kv_view=kv_view,
        )
        for j, r in enumerate(pp.receivers):
            scores[graph.reader_index(r), [graph.writer_index(w) for w in pp.senders]] = pp.effects[
                :, j
            ]
    return Attribution(
        method="path_patch",
        granularity="edge",
        mode="denoise",
        metric=pp.metric,
        writers=graph.writers,
        readers=graph.readers,
        scores=np.where(graph.valid, scores, np.nan),
        n_examples=pp.n_examples,
        n_layers=graph.n_layers,
        n_heads=graph.n_heads,
        clean_metric=pp.clean_metric,
        corrupt_metric=pp.corrupt_metric,
        meta=dict(pp.meta),
    )


@takes_probe_model
def family_attributions(
    model: ProbeModel,
    task,
    n: int = 256,
    *,
    kinds: Sequence[str] = ("position", "content"),
    seed: int = 0,
    positional: bool = False,
    aligned: bool = False,
    **kwargs,
) -> dict[str, Attribution]:
    """One edge attribution per counterfactual family of ``task`` (``task.counterfactuals(n,
    kind, seed)``), with the same metric (default ``"margin"``) so that the families' scores share
    units; ``positional`` adds scores per span of the task (``task.spans`` of the clean rows);
    ``aligned``: the position family's scores σ-aligned (:func:`probes.attribute`; the other
    families change tokens, not positions, and are scored as they are). ``kwargs`` go to
    :func:`probes.attribute` (``method="path_patch"``: exact scores from :func:`exact_edges`
    instead, not per span)."""
    kwargs.setdefault("metric", "margin")
    method = kwargs.pop("method", "atp")
    if method == "path_patch":  # exact
        kwargs.pop("progress", None)  # one path patch per component: no bar of its own
        if aligned:
            raise ValueError(
                "family_attributions: aligned scores are attribution estimates ('atp'); exact path patching "
                "patches at fixed indices"
            )
        if positional:
            raise ValueError(
                "family_attributions: exact scores (method='path_patch') are not per span; use 'atp' or 'eap-ig'"
            )
        return {
            kind: exact_edges(model, task.counterfactuals(n, kind=kind, seed=seed), **kwargs)
            for kind in kinds
        }
    kwargs.setdefault("granularity", "edge")
    out = {}
    for kind in kinds:
        pairs = task.counterfactuals(n, kind=kind, seed=seed)
        extra = (
            dict(spans=task.spans(pairs.clean), span_names=task.span_names) if positional else {}
        )
        if kwargs.get("progress"):
            kwargs["progress"] = f"{kind} pairs ({method})"
        out[kind] = attribute(
            model, pairs, method=method, aligned=aligned and kind == "position", **extra, **kwargs
        )
    return out


def head_of(name: str) -> tuple[int, int]:
    s = parse(name)
    if s.head is None:
        raise ValueError(f"{name!r} is not a head")
    return s.layer, s.head


__all__ = ["exact_edges", "family_attributions", "head_of"]

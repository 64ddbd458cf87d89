"""Circuits: the edges that matter, how faithful they are, and what of them is position and what
content.

- :func:`circuit` keeps the top edges of an edge :class:`~probes.attribution.Attribution` (or of
  several, one per counterfactual family) and returns a frozen :class:`Circuit`.
- :func:`faithfulness_curve` runs the clean input with every edge outside the top ``n`` ablated
  (each reader's input rebuilt with the ablated writers' terms replaced: by the corrupt run's,
  a resampled example's, or their mean per position; TransformerLens' ``faithfulness`` rule) for
  many ``n`` at once, batched, exact.
- :func:`family_attributions` scores every edge under each counterfactual family of the task
  (``task.counterfactuals(n, kind)``), so every edge gets a positional and a content score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.io import atomic_write_json, nan_array, read_json, to_json
from pe_interp.modes import eval_mode
from probes.attribution import Attribution, attribute
from probes.engine import (
    Run,
    as_pair,
    as_run,
    capture,
    contributions,
    forks,
    pair_labels,
    position_means,
    resolve,
    writer_hooks,
)
from probes.graph import Graph, build_graph, parse

ABLATIONS = ("corrupt", "resample", "mean")


@dataclass(frozen=True, eq=False)
class Circuit:
    """A set of edges with their scores. ``scores[family]`` is ``[n_edges]`` (one family
    ``"score"`` for a single attribution); ``ranking`` is what selected them (largest first)."""

    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    scores: dict[str, np.ndarray]
    ranking: np.ndarray
    n_layers: int
    n_heads: int
    total_edges: int
    method: str = ""
    metric: str = ""
    faithfulness: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def share(self, family: str = "position", against: str = "content") -> np.ndarray:
        """Per edge ``|family| / (|family| + |against|)`` (NaN where both are 0)."""
        a, b = np.abs(self.scores[family]), np.abs(self.scores[against])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(a + b > 0, a / (a + b), np.nan)

    def into(self, node: str) -> list[int]:
        """Indices of the edges whose reader belongs to ``node`` (``"L0H4"`` takes its q, k, v)."""
        return [i for i, (_, r) in enumerate(self.edges) if r == node or r.split(".")[0] == node]

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "edges": [list(e) for e in self.edges],
                "scores": {k: to_json(v) for k, v in self.scores.items()}, "ranking": to_json(self.ranking),
                "n_layers": self.n_layers, "n_heads": self.n_heads, "total_edges": self.total_edges,
                "method": self.method, "metric": self.metric, "faithfulness": to_json(self.faithfulness),
                "meta": to_json(self.meta)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Circuit:
        return cls(tuple(d["nodes"]), tuple((a, b) for a, b in d["edges"]),
                   {k: nan_array(v) for k, v in d["scores"].items()}, nan_array(d["ranking"]), int(d["n_layers"]),
                   int(d["n_heads"]), int(d["total_edges"]), d.get("method", ""), d.get("metric", ""),
                   d.get("faithfulness"), dict(d.get("meta") or {}))  # fmt: skip

    def save(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_dict(), indent=1, sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> Circuit:
        return cls.from_dict(read_json(path))


def _node_of(reader: str) -> str:
    return reader.split(".")[0]


def circuit(
    scores: Attribution | Mapping[str, Attribution],
    *,
    top_n: int | None = None,
    threshold: float | None = None,
    by: str | None = None,
) -> Circuit:
    """The top edges of ``scores``: the ``top_n`` that rank highest, or every edge whose ranking
    (``|score|``, or ``"atp*"``'s magnitude) is at least ``threshold``. With one attribution per
    family (``{"position": ..., "content": ...}``) edges rank by the sum of the families'
    rankings, or by family ``by``; each edge keeps every family's score."""
    if (top_n is None) == (threshold is None):
        raise ValueError("circuit: pass exactly one of top_n= and threshold=")
    fams = {"score": scores} if isinstance(scores, Attribution) else dict(scores)
    if not fams:
        raise ValueError("circuit: no scores")
    first = next(iter(fams.values()))
    for name, a in fams.items():
        if not isinstance(a, Attribution) or a.granularity != "edge":
            raise ValueError(f"circuit: {name!r} must be an edge Attribution (attribute(..., granularity='edge'))")
        if a.writers != first.writers or a.readers != first.readers:
            raise ValueError(f"circuit: {name!r} scores another graph than the others")
    if by is not None and by not in fams:
        raise ValueError(f"circuit: by={by!r} is not one of {', '.join(fams)}")
    rank = fams[by].ranking if by else sum(np.nan_to_num(a.ranking, nan=0.0) for a in fams.values())
    rank = np.where(np.isnan(first.scores), np.nan, rank)
    flat = np.nan_to_num(rank, nan=-np.inf).ravel()
    order = np.argsort(-flat, kind="stable")
    n_valid = int((~np.isnan(rank)).sum())
    if top_n is not None:
        if not isinstance(top_n, int) or top_n < 0:
            raise ValueError(f"circuit: top_n must be a non-negative integer, got {top_n!r}")
        keep = order[: min(top_n, n_valid)]
    else:
        keep = order[flat[order] >= threshold]
    W = len(first.writers)
    pairs = [divmod(int(i), W) for i in keep]
    edges = tuple((first.writers[w], first.readers[r]) for r, w in pairs)
    nodes = sorted({w for w, _ in edges} | {_node_of(r) for _, r in edges}, key=lambda x: (_depth(x, first.n_layers), x))
    return Circuit(
        nodes=tuple(nodes), edges=edges,
        scores={k: np.array([a.scores[r, w] for r, w in pairs]) for k, a in fams.items()},
        ranking=np.array([rank[r, w] for r, w in pairs]), n_layers=first.n_layers, n_heads=first.n_heads,
        total_edges=n_valid, method=first.method, metric=first.metric,
        meta={"selection": {"top_n": top_n, "threshold": threshold, "by": by}, **first.meta},
    )  # fmt: skip


def _depth(name: str, n_layers: int) -> float:
    from probes.graph import node_layer

    return node_layer(name, n_layers)


# ---------------------------------------------------------------------------------------------
# faithfulness: the clean run with the edges outside the circuit ablated
# ---------------------------------------------------------------------------------------------
def _reader_groups(graph: Graph) -> list[tuple[str, list[int], bool]]:
    """``(hook, reader indices, per-head)`` of each reader hook, in graph order."""
    out = []
    for layer in range(graph.n_layers):
        for c in "qkv":
            out.append((f"blocks.{layer}.attn.hook_{c}_input",
                        [graph.reader_index(f"L{layer}H{h}.{c}") for h in range(graph.n_heads)], True))  # fmt: skip
        if graph.has_mlp:
            out.append((f"blocks.{layer}.hook_mlp_in", [graph.reader_index(f"MLP{layer}")], False))
    out.append((f"blocks.{graph.n_layers - 1}.hook_resid_post", [graph.reader_index("logits")], False))
    return out


def ablated_metric(model, graph: Graph, run: Run, repl: Tensor, keep: Tensor, fn, good, bad) -> Tensor:
    """Per-example metric ``[k, b]`` of ``k`` copies of ``run``, copy ``j`` keeping the edges where
    ``keep[j, reader, writer]`` and reading ``repl`` (``[b or 1, pos, writers, d]``) for the rest."""
    k, b = keep.shape[0], len(run)
    excl = (~keep & torch.as_tensor(graph.valid, device=keep.device)).to(repl.dtype)
    live: dict[str, Tensor] = {}

    def grab(x, hook):
        live[hook.name] = x
        return None

    def fix(idx: list[int], per_head: bool):
        def hook(x, hook):
            contrib = contributions(model, graph, live)  # the writers so far (later ones are not read)
            nw = contrib.shape[2]
            diff = repl[..., :nw, :].expand(b, -1, -1, -1)[None] - contrib.view(k, b, *contrib.shape[1:])
            add = torch.einsum("kbpwd,krw->kbprd", diff, excl[:, idx, :nw])
            return x + (add.reshape(k * b, *add.shape[2:]) if per_head else add.reshape(k * b, x.shape[1], -1))
        return hook

    hooks = [(n, grab) for n in writer_hooks(graph)] + [(h, fix(idx, ph)) for h, idx, ph in _reader_groups(graph)]
    tokens = run.tokens.repeat(k, 1)
    kv = None if run.key_valid is None else run.key_valid.repeat(k, 1)
    with forks(model), torch.no_grad(), model.hooks(fwd_hooks=hooks):
        _prime(live, model, graph, k * b, run)
        logits = model.forward_unchecked(tokens, kv)
    return fn(logits, good.repeat(k), bad.repeat(k)).double().view(k, b)


def _prime(live: dict, model, graph: Graph, rows: int, run: Run) -> None:
    """Zeros at every writer hook, so that :func:`contributions` can run before they fire (the
    zero terms of writers that have not fired are never read: their edges do not exist yet)."""
    P, d = run.tokens.shape[1], model.cfg.d_model
    zeros = torch.zeros(rows, P, d, dtype=model.W_E.dtype, device=run.tokens.device)
    live["hook_embed"] = zeros
    for layer in range(graph.n_layers):
        live[f"blocks.{layer}.attn.hook_z"] = zeros.new_zeros(rows, P, graph.n_heads, model.cfg.d_head)
        if graph.has_mlp:
            live[f"blocks.{layer}.hook_mlp_out"] = zeros


def faithfulness_curve(
    model,
    scores: Attribution | Circuit,
    clean: Any,
    corrupt: Any = None,
    *,
    sizes: Sequence[int] | None = None,
    ablation: str = "corrupt",
    metric: Any = "margin",
    reference: Any = None,
    seed: int = 0,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """The metric with only the top ``n`` edges of ``scores`` kept, for each ``n`` in ``sizes``.

    ``ablation``: ``"corrupt"`` (the paired corrupt run's writer terms; needs ``corrupt``),
    ``"resample"`` (those of another clean example: a seeded derangement), ``"mean"`` (their mean
    per position over ``reference``, default the clean batch). Returns ``{"sizes", "metric"
    (mean per size), "full", "empty", "recovered" ((m - empty) / (full - empty)), "ablation",
    "per_example" ([sizes, n])}``.
    """
    if ablation not in ABLATIONS:
        raise ValueError(f"faithfulness_curve: ablation must be one of {', '.join(ABLATIONS)}; got {ablation!r}")
    graph = build_graph(model.cfg)
    c, k = as_pair(model, clean, corrupt)
    if ablation == "corrupt" and k is None:
        raise ValueError("faithfulness_curve: ablation='corrupt' needs corrupt= (or CounterfactualPairs)")
    if isinstance(scores, Circuit):
        order = [(graph.reader_index(r), graph.writer_index(w)) for w, r in scores.edges]
    else:
        rank = np.nan_to_num(scores.ranking, nan=-np.inf).ravel()
        idx = np.argsort(-rank, kind="stable")[: int((~np.isnan(scores.ranking)).sum())]
        order = [divmod(int(i), len(graph.writers)) for i in idx]
    sizes = list(sizes) if sizes is not None else sorted({0, *np.unique(np.geomspace(1, max(1, len(order)), 12).astype(int)), len(order)})
    if any(s < 0 or s > len(order) for s in sizes):
        raise ValueError(f"faithfulness_curve: sizes must be in 0..{len(order)}")
    _, fn = resolve(metric)
    good, bad = pair_labels(c, k)
    rows = batch_size or 256
    R, W = graph.valid.shape
    # one copy per size, then every edge kept (the clean run), then none
    keep = torch.zeros(len(sizes) + 2, R, W, dtype=torch.bool, device=c.tokens.device)
    for j, s in enumerate(sizes):
        for r, w in order[:s]:
            keep[j, r, w] = True
    keep[len(sizes)] = torch.as_tensor(graph.valid)
    names = writer_hooks(graph)
    with eval_mode(model):
        if ablation == "mean":
            ref = c if reference is None else as_run(model, reference, what="reference")
            means = position_means(model, ref, names, rows)
            repl_all = contributions(model, graph, {n: m[None, : c.tokens.shape[1]] for n, m in means.items()}).detach()
        out = torch.empty(keep.shape[0], len(c), dtype=torch.float64)
        per = max(1, rows // max(1, min(len(c), rows)))
        chunk = max(1, min(len(c), rows))
        for c0 in range(0, len(c), chunk):
            sl = slice(c0, c0 + chunk)
            part = c.rows(sl)
            if ablation == "mean":
                repl = repl_all
            else:
                src = k.rows(sl) if ablation == "corrupt" else _resampled(c, sl, seed)
                with torch.no_grad():
                    repl = contributions(model, graph, capture(model, src, names)[0])
            for j0 in range(0, keep.shape[0], per):
                out[j0 : j0 + per, sl] = ablated_metric(model, graph, part, repl, keep[j0 : j0 + per], fn, good[sl], bad[sl]).cpu()
    m = out.mean(1).numpy()
    full, empty = float(m[len(sizes)]), float(m[-1])
    body = m[: len(sizes)]
    return {"sizes": sizes, "metric": body.tolist(), "full": full, "empty": empty,
            "recovered": ((body - empty) / (full - empty)).tolist() if full != empty else [float("nan")] * len(sizes),
            "ablation": ablation, "per_example": out[: len(sizes)].numpy(), "total_edges": graph.n_edges}  # fmt: skip


def _resampled(c: Run, sl: slice, seed: int) -> Run:
    from probes.ablation import resample_sources

    src = resample_sources(len(c), None, seed).to(c.tokens.device)[sl]
    kv = None if c.key_valid is None else c.key_valid[src]
    return Run(c.tokens[src], kv, c.pad_mask[src], c.labels[src])


def exact_edges(model, clean: Any, corrupt: Any = None, *, metric: Any = "margin", batch_size: int | None = None) -> Attribution:
    """Every edge's exact effect (:func:`probes.path_patch`, clean into corrupt) in the shape of an
    edge :class:`Attribution` (``method="path_patch"``), so that :func:`circuit` and the
    agreement measures take exact and estimated scores alike."""
    from probes.path_patching import path_patch

    graph = build_graph(model.cfg)
    scores = np.full(graph.valid.shape, np.nan)
    for comp in "qkv":
        receivers = [r for r in graph.readers if r.endswith(f".{comp}") or (comp == "q" and "." not in r)]
        pp = path_patch(model, clean, corrupt, None, receivers, comp, metric=metric, batch_size=batch_size)
        for j, r in enumerate(pp.receivers):
            scores[graph.reader_index(r), [graph.writer_index(w) for w in pp.senders]] = pp.effects[:, j]
    return Attribution(method="path_patch", granularity="edge", mode="denoise", metric=pp.metric, writers=graph.writers,
                       readers=graph.readers, scores=np.where(graph.valid, scores, np.nan), n_examples=pp.n_examples,
                       n_layers=graph.n_layers, n_heads=graph.n_heads, clean_metric=pp.clean_metric,
                       corrupt_metric=pp.corrupt_metric, meta=dict(pp.meta))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# position and content
# ---------------------------------------------------------------------------------------------
def family_attributions(model, task, n: int = 256, *, kinds: Sequence[str] = ("position", "content"), seed: int = 0,
                        **kwargs) -> dict[str, Attribution]:  # fmt: skip
    """One edge attribution per counterfactual family of ``task`` (``task.counterfactuals(n,
    kind, seed)``), with the same metric (default ``"margin"``) so that the families' scores share
    units; ``kwargs`` go to :func:`probes.attribute` (``method="path_patch"``: exact scores from
    :func:`exact_edges` instead)."""
    kwargs.setdefault("metric", "margin")
    method = kwargs.pop("method", "atp")
    if method == "path_patch":  # exact
        return {kind: exact_edges(model, task.counterfactuals(n, kind=kind, seed=seed), **kwargs) for kind in kinds}
    kwargs.setdefault("granularity", "edge")
    return {kind: attribute(model, task.counterfactuals(n, kind=kind, seed=seed), method=method, **kwargs) for kind in kinds}


def head_of(name: str) -> tuple[int, int]:
    s = parse(name)
    if s.head is None:
        raise ValueError(f"{name!r} is not a head")
    return s.layer, s.head


__all__ = ["ABLATIONS", "Circuit", "ablated_metric", "circuit", "exact_edges", "faithfulness_curve",
           "family_attributions", "head_of"]

"""What a circuit's edges outside it read, and the evaluator that measures keep masks.

An ablated edge's reader reads the writer's term from another run instead of the live one
(TransformerLens' ``faithfulness`` rule). What it reads is a
:class:`probes.common.replace.Replacement` at the writer hooks (:func:`replaced_terms`), built once
from :data:`ABLATIONS`' shorthand by :func:`edge_replacement` (the paired corrupt run's, σ-aligned
where asked; a resampled clean example's, a seeded derangement; their mean per position) or passed
as one (zero, say). :class:`EdgeEvaluator` measures keep masks ``[k, readers, writers, spans]`` on
fixed pairs through :func:`probes.circuits.edge_ablation.ablated_metric`, with the clean run
(everything kept) and the corrupt one (nothing kept) as the ends of the scale. Used by
:mod:`probes.circuits.faithfulness`, :mod:`probes.circuits.acdc` and :mod:`probes.circuits.learned`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.util.modes import eval_mode
from probes.circuits.alignment import moved
from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.engine import (
    Run,
    as_pair,
    as_run,
    pair_labels,
    resolve,
    writer_hooks,
    writer_term,
)
from probes.circuits.graph import Graph, build_graph, check_kv_view
from probes.circuits.scores import span_ids
from probes.common.inputs import check_count, check_finite_model
from probes.common.options import FAITHFULNESS_ABLATIONS
from probes.common.replace import Replacement, replacement

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = [
    "ABLATIONS",
    "EdgeEvaluator",
    "edge_replacement",
    "has_gap",
    "replaced_terms",
    "unit_span_names",
]


ABLATIONS = FAITHFULNESS_ABLATIONS
MEMORY_BUDGET = 2 << 30  # bytes of writer differences one evaluation forward may hold


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

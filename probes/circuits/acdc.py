"""The exact reference circuit: iterative edge pruning (ACDC, Conmy et al. 2023), every decision
an exact forward of the circuit with one more edge ablated.

Start from every unit (edge, or edge at a span) kept. Visit the readers from the logits down
(the readout, then the last layer's MLP and heads, ..., layer 0); for each, try its incoming units
(the latest writer first, spans in order) one at a time: ablate the unit (its reader reads the
corrupt run's term there, :func:`probes.circuits.faithfulness.ablated_metric`) and keep it
ablated when the mean metric moves less than ``tau`` times the clean-minus-corrupt gap, so
``tau`` is in units of faithfulness. Units into a reader that no kept unit connects to the logits
any more change nothing when ablated; they are removed without a forward. The result is pruned
(:func:`probes.circuits.selection.prune`).

Speculation makes it fast without changing a decision: ``k`` copies of the batch test the next
``k`` units at once, copy ``j`` with units ``1..j`` ablated (as if each were removed, which most
are); decisions are read in order against the previous copy's metric, and at the first unit kept
the copies after it are discarded and the search resumes after it. ``k`` doubles after a round
with no unit kept and halves after one whose first unit is kept.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from probes.circuits.engine import resolve
from probes.circuits.evaluator import EdgeEvaluator, has_gap, unit_span_names
from probes.circuits.paths import backward_through, prune
from probes.circuits.selection import Circuit, circuit_from_mask

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def acdc(
    model: ProbeModel,
    clean: Any,
    corrupt: Any = None,
    *,
    tau: float = 0.01,
    spans: Any = None,
    span_names: Any = None,
    metric: Any = "margin",
    speculate: int = 32,
    batch_size: int | None = None,
    progress: bool = False,
    kv_view: str = "grouped",
) -> Circuit:
    """The ACDC circuit of ``clean`` against ``corrupt`` (``CounterfactualPairs`` or two batches).
    ``spans`` (the task, or ``[n, pos]`` ids with ``span_names``): one unit per edge and span;
    spans no example occupies, and pads of a model that masks them, hold no unit.

    Returns a :class:`Circuit` (``method="acdc"``; ``scores["acdc"]``: each kept unit's metric
    change when it was tested), whose ``faithfulness["kept"]`` is its recovered share on these
    pairs and ``meta["acdc"]`` the forwards, seconds, ``tau`` and the threshold in metric units.
    ``progress``: a bar of the units decided, with the number kept, and an ETA. ``kv_view``: as
    :func:`probes.attribute`'s."""
    if not isinstance(tau, int | float) or not 0 <= tau < 1:
        raise ValueError(f"acdc: tau must be in [0, 1), got {tau!r}")
    if not isinstance(speculate, int) or speculate < 1:
        raise ValueError(f"acdc: speculate must be a positive integer, got {speculate!r}")
    t0 = time.perf_counter()
    names = unit_span_names(spans, span_names, "acdc")
    S = max(1, len(names))
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        ablation="corrupt",
        metric=metric,
        reference=None,
        seed=0,
        batch_size=batch_size or 256 * 4,
        spans=spans,
        n_spans=S,
        who="acdc",
        kv_view=kv_view,
    )
    graph = ev.graph
    units = ev.units()
    full, empty = ev.ends()
    threshold = tau * abs(full - empty)
    keep = units.copy()
    current = float(ev(keep[None]).mean())
    bar = _bar(int(units.sum()), tau) if progress else None
    search = _Search(ev, keep, current, threshold, speculate, bar)
    for r in reversed(range(len(graph.readers))):
        search.visit(r, S)
    if bar is not None:
        bar.close()
    keep = prune(graph, keep)
    final = float(ev(keep[None]).mean())
    meta = {
        "acdc": {
            "tau": float(tau),
            "threshold": threshold,
            "forwards": search.forwards + 1,
            "seconds": time.perf_counter() - t0,
            "n_pairs": len(ev.c),
        },
        "encoding": model.cfg.encoding_name,
    }
    c = circuit_from_mask(
        graph,
        keep,
        names,
        scores={"acdc": search.effect},
        rank=np.abs(search.effect),
        total=int(units.sum()),
        method="acdc",
        metric=resolve(metric)[0],
        meta=meta,
    )
    return _with_faithfulness(c, final, full, empty, int(units.sum()))


def _bar(total: int, tau: float):
    """A bar of the units decided, with the number kept, and an ETA."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"acdc tau={tau:g}", unit="unit")


class _Search:
    """ACDC's state over the readers: the units kept (``keep``, changed in place), each tested
    unit's metric change when kept, the current metric, the forwards run and the speculation
    width ``k``."""

    def __init__(self, ev, keep: np.ndarray, current: float, threshold: float, speculate: int, bar):
        self.ev, self.keep, self.current = ev, keep, current
        self.threshold, self.speculate, self.bar = threshold, speculate, bar
        self.effect = np.full(keep.shape, np.nan)
        self.forwards = 1
        self.k = min(4, speculate)

    def visit(self, r: int, S: int) -> None:
        """Try the units into reader ``r`` (the latest writer first, spans in order), ``k`` at a
        time; those no kept unit connects to the logits any more go without a forward."""
        graph, keep = self.ev.graph, self.keep
        used = backward_through(graph, keep, False)[
            r
        ]  # [S]: whether the reader still reaches the logits
        before = int(keep[r].sum())
        keep[r] &= used[None, :]
        cands = [
            (r, w, s)
            for w in reversed(range(len(graph.writers)))
            for s in range(S)
            if keep[r, w, s]
        ]
        if self.bar is not None:
            self.bar.update(before - len(cands))  # no longer connected: removed without a forward
        i = 0
        while i < len(cands):
            batch = cands[i : i + self.k]
            took = self._try(batch)
            if took == len(batch):
                i += len(batch)
                self.k = min(self.speculate, 2 * self.k)
            else:
                i += took + 1
                self.k = max(1, self.k // 2) if took == 0 else self.k
            if self.bar is not None:
                self.bar.update(min(took + 1, len(batch)))
                self.bar.set_postfix(kept=int(np.isfinite(self.effect).sum()), refresh=False)

    def _try(self, batch: list[tuple[int, int, int]]) -> int:
        """One speculative forward, copy ``j`` with units ``1..j`` ablated; the decisions read in
        order up to the first unit kept. Returns the number removed before it."""
        keep = self.keep
        masks = np.repeat(keep[None], len(batch), axis=0)
        for j, u in enumerate(batch):
            masks[j:, u[0], u[1], u[2]] = False
        vals = self.ev(masks).mean(1)
        self.forwards += 1
        prev, took = self.current, 0
        for j, u in enumerate(batch):
            if abs(vals[j] - prev) < self.threshold:
                keep[u] = False
                prev = self.current = float(vals[j])
                took += 1
            else:
                self.effect[u] = vals[j] - prev
                break
        return took


def _with_faithfulness(c: Circuit, final: float, full: float, empty: float, total: int) -> Circuit:
    """``c`` with its recovered share on the pairs it was found on."""
    recovered = (final - empty) / (full - empty) if has_gap(full, empty) else float("nan")
    return Circuit(
        **{
            **c.__dict__,
            "faithfulness": {
                "kept": recovered,
                "size": len(c.edges),
                "metric_kept": final,
                "full": full,
                "empty": empty,
                "total_edges": total,
            },
        }
    )


def overlap(found: Circuit, reference: Circuit) -> dict[str, float]:
    """Precision (the share of ``found``'s units in ``reference``) and recall (the share of
    ``reference``'s units in ``found``), units compared as (writer, reader, span)."""

    def units(c: Circuit) -> set:
        return {(w, r, c.spans[i] if c.positional else None) for i, (w, r) in enumerate(c.edges)}

    a, b = units(found), units(reference)
    both = len(a & b)
    return {
        "precision": both / len(a) if a else float("nan"),
        "recall": both / len(b) if b else float("nan"),
        "found": len(a),
        "reference": len(b),
        "common": both,
    }


__all__ = ["acdc", "overlap"]

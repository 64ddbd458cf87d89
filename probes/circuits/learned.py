"""Learned circuits: a mask over the units (edges, or edges at a span) optimised for faithfulness
and sparsity together, instead of ranked by first-order scores.

Attribution scores each unit with everything else clean; a circuit that ablates most of the graph
is far from that point, and units that matter only together (or only once others are gone) rank
low. Here every unit ``u`` has a logit ``theta_u`` and a mask ``m_u = sigmoid(beta * theta_u)``;
the reader of an edge reads ``m * live + (1 - m) * corrupt`` at the unit's span
(:func:`probes.circuits.faithfulness.ablated_metric` with a soft mask), and Adam minimises

    (1 - recovered)^2 + sparsity * mean(m)

on the selection pairs, ``recovered`` being the faithfulness of the soft circuit. ``beta`` grows
geometrically from 1 to ``beta`` over the steps, so the masks end near 0 or 1 (continuous
sparsification, Savarese et al. 2020; Edge Pruning, Bhaskar et al. 2024, learns edge masks the
same way with hard-concrete noise, which this deterministic version leaves out so that the result
is a function of its inputs alone).

The learned logits order the units like attribution scores do (:func:`learn_ranking` returns a
:class:`~probes.circuits.selection.Ranking`, ``method="learned"``), so
:func:`~probes.circuits.faithfulness.faithfulness_curve` and
:func:`~probes.circuits.faithfulness.minimal_circuit` measure it on held-out pairs unchanged. The
circuit the optimisation ended on is the prefix of the units with ``theta > 0``
(``meta["learned"]["size"]``); larger and smaller prefixes follow the logits' order.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from pe_interp.modes import eval_mode
from probes.circuits.engine import capture, contributions, resolve, writer_hooks
from probes.circuits.faithfulness import _Evaluator, ablated_metric, unit_span_names
from probes.circuits.selection import SELECTIONS, Ranking, order_units
from probes.inputs import check_count


def learn_ranking(
    model,
    clean: Any,
    corrupt: Any = None,
    *,
    spans: Any = None,
    span_names: Any = None,
    metric: Any = "margin",
    sparsity: float = 0.5,
    steps: int = 150,
    lr: float = 0.1,
    beta: float = 200.0,
    init: float = 3.0,
    select: str = "paths",
    batch_size: int | None = None,
    progress: bool = False,
) -> Ranking:
    """Units of ``clean`` against ``corrupt`` (``CounterfactualPairs`` or two batches) ranked by
    learned mask logits (see the module docstring). ``spans`` (the task, or ``[n, pos]`` span
    ids with ``span_names``): one unit per edge and span (spans no real position occupies hold
    none). ``sparsity`` weighs the mean mask against ``(1 - recovered)^2``; ``steps`` Adam steps
    at ``lr`` from every logit at ``init``, the mask's sharpness growing from 1 to ``beta``.
    Deterministic: no noise, no seed. Each step runs every pair in one batch (``batch_size``
    sizes the exact measurements only); a few hundred pairs of a quick model fit in memory.

    Returns a :class:`Ranking` (``rank``: ``sigmoid(theta)`` of each unit; ``scores["learned"]``:
    ``theta``) whose ``meta["learned"]`` holds the settings, ``size`` (units with
    ``theta > 0``), the soft circuit's last ``recovered`` and ``density`` (and their curves per
    step), ``recovered_hard`` (the units with ``theta > 0`` kept, the others ablated: an exact
    forward), the ``full`` and ``empty`` metrics and ``seconds``."""
    who = "learn_ranking"
    for name, v, lo in (("sparsity", sparsity, 0.0), ("lr", lr, 1e-12), ("beta", beta, 1.0)):
        if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v) or v < lo:
            raise ValueError(f"{who}: {name} must be a finite number >= {lo:g}, got {v!r}")
    check_count(steps, "steps", 1, who)
    if select not in SELECTIONS:
        raise ValueError(f"{who}: select must be one of {', '.join(map(repr, SELECTIONS))}; got {select!r}")
    t0 = time.perf_counter()
    names = unit_span_names(spans, span_names, who)
    S = max(1, len(names))
    ev = _Evaluator(model, clean, corrupt, ablation="corrupt", metric=metric, reference=None, seed=0,
                    batch_size=batch_size, spans=spans, n_spans=S, who=who)  # fmt: skip
    graph = ev.graph
    full, empty = ev.ends()
    if full == empty:
        raise ValueError(f"{who}: the clean and corrupt runs score the same ({full:.4g}); nothing to recover")
    units = ev.units()
    device = ev.c.tokens.device
    unit_t = torch.as_tensor(units, device=device)
    frozen = [p for p in model.parameters() if p.requires_grad]
    history: dict[str, list[float]] = {"recovered": [], "density": [], "loss": []}
    theta = torch.full(units.shape, float(init), dtype=model.W_E.dtype, device=device, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=lr)
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="learn circuit", unit="step")
    try:
        for p in frozen:
            p.requires_grad_(False)
        with eval_mode(model):
            with torch.no_grad():
                repl = contributions(model, graph, capture(model, ev.k, writer_hooks(graph))[0])
            for step in it:
                sharp = beta ** (step / max(1, steps - 1))
                m = torch.where(unit_t, torch.sigmoid(theta * sharp), torch.ones_like(theta))
                per = ablated_metric(model, graph, ev.c, repl, m[None], ev.fn, ev.good, ev.bad, ev.ids)
                rec = (per.mean() - empty) / (full - empty)
                density = m[unit_t].mean()
                loss = (1 - rec) ** 2 + sparsity * density
                opt.zero_grad()
                loss.backward()
                opt.step()
                for k, v in (("recovered", rec), ("density", density), ("loss", loss)):
                    history[k].append(float(v.detach()))
    finally:
        for p in frozen:
            p.requires_grad_(True)
    th = theta.detach().double().cpu().numpy()
    ended = (th > 0) & units
    hard = float(ev(ended[None]).mean())
    rank = np.where(units, 1 / (1 + np.exp(-th)), np.nan)
    order, value = order_units(graph, rank, units, select)
    meta = {"learned": {"sparsity": float(sparsity), "steps": int(steps), "lr": float(lr), "beta": float(beta),
                        "init": float(init), "size": int(ended.sum()), "recovered": history["recovered"][-1],
                        "recovered_hard": (hard - empty) / (full - empty), "density": history["density"][-1],
                        "history": history, "full": full, "empty": empty, "n_pairs": len(ev.c),
                        "seconds": time.perf_counter() - t0}}  # fmt: skip
    return Ranking(graph=graph, order=order, value=value, rank=rank, scores={"learned": np.where(units, th, np.nan)},
                   span_names=names, select=select, method="learned", metric=resolve(metric)[0], meta=meta)  # fmt: skip


__all__ = ["learn_ranking"]

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

With ``budget`` the size is asked for instead of weighed: the mask becomes
``m_u = sigmoid(beta * theta_u - tau)``, ``tau`` set at every step (bisection) so that the mean
mask equals the density allowed, which falls linearly from 1 to ``budget`` over the first
``anneal`` share of the steps and then stays; ``beta`` stays 1 while it falls and grows after;
the loss is ``(1 - recovered)^2`` alone. ``tau`` is differentiated implicitly (``d tau / d x_u =
sigmoid'_u / sum sigmoid'``), so the gradient is projected on the budget: a unit rises only by
displacing others. Without that term Adam moved every kept logit up alike, ``tau`` followed and
the kept units never separated (0.33 of the metric at 10% of a random model's units, against
0.94 with it); a Lagrange multiplier on the density (Edge Pruning's target sparsity, Bhaskar et
al. 2024) overshot the budget, and a straight-through top-k (movement pruning, Sanh et al. 2020)
recovered 0.18 there. The optimisation traces a path of circuits, one per budget, and the units
are ranked along it: those kept at the end by their logits, then the others by the step they
were last dropped at (``beta * theta - tau`` crossing 0), latest first, so that every prefix is
near a circuit the path held rather than a by-product of one size. The circuit it ends on is the
``round(budget * units)`` largest logits, and ``theta`` is reported shifted so that ``theta > 0``
is that circuit in both modes.

The learned logits order the units like attribution scores do (:func:`learn_ranking` returns a
:class:`~probes.circuits.selection.Ranking`, ``method="learned"``), so
:func:`~probes.circuits.faithfulness.faithfulness_curve` and
:func:`~probes.circuits.faithfulness.minimal_circuit` measure it on held-out pairs unchanged. The
circuit the optimisation ended on is the prefix of the units with ``theta > 0``
(``meta["learned"]["size"]``); larger and smaller prefixes follow the logits' order.

The :class:`~probes.circuits.selection.Ranking` holds in ``rank`` each unit's ``sigmoid(theta)``,
or its place on the path; in ``scores["learned"]`` ``theta``, and with ``budget`` in
``scores["dropped"]`` the step each unit was last dropped at (-1 for the circuit it ended on,
``steps`` for a unit the last step dropped). Its ``meta["learned"]`` holds the settings, ``size``
(units with ``theta > 0``), the soft circuit's last ``recovered`` and ``density`` (and their
curves per step; with ``budget`` also the density ``allowed``), ``recovered_hard`` (the units with
``theta > 0`` kept, the others ablated: an exact forward), the ``full`` and ``empty`` metrics and
``seconds``. A few hundred pairs of a quick model fit in memory.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pe_interp.util.modes import eval_mode
from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.engine import resolve
from probes.circuits.evaluator import EdgeEvaluator, has_gap, unit_span_names
from probes.circuits.selection import SELECTIONS, Ranking, order_units
from probes.common.inputs import check_count

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def learn_ranking(
    model: ProbeModel,
    clean: Any,
    corrupt: Any = None,
    *,
    spans: Any = None,
    span_names: Any = None,
    metric: Any = "margin",
    sparsity: float = 0.5,
    budget: float | None = None,
    anneal: float = 0.5,
    steps: int = 150,
    lr: float = 0.1,
    beta: float = 200.0,
    init: float = 3.0,
    select: str = "paths",
    batch_size: int | None = None,
    progress: bool = False,
    kv_view: str = "grouped",
) -> Ranking:
    """Units of ``clean`` against ``corrupt`` (``CounterfactualPairs`` or two batches) ranked by
    learned mask logits (the module docstring says how, and what the :class:`Ranking` holds).
    ``spans`` (the task, or ``[n, pos]`` span ids with ``span_names``): one unit per edge and
    span. ``sparsity`` weighs the mean mask against ``(1 - recovered)^2``; ``budget`` (a density
    in (0, 1)) asks for the size instead, falling to it over the ``anneal`` share of the steps.
    ``steps`` Adam steps at ``lr`` from every logit at ``init``, the mask's sharpness growing
    from 1 to ``beta``. Deterministic: no noise, no seed. Each step runs every pair in one batch
    (``batch_size`` sizes the exact measurements only; ``kv_view`` as :func:`probes.attribute`'s)."""
    who = "learn_ranking"
    _check_settings(who, sparsity, lr, beta, steps, budget, anneal, select)
    start = time.perf_counter()
    names = unit_span_names(spans, span_names, who)
    S = max(1, len(names))
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        ablation="corrupt",
        metric=metric,
        reference=None,
        seed=0,
        batch_size=batch_size,
        spans=spans,
        n_spans=S,
        who=who,
        kv_view=kv_view,
    )
    graph = ev.graph
    full, empty = ev.ends()
    if not has_gap(full, empty):
        raise ValueError(
            f"{who}: the clean and corrupt runs score the same ({full:.4g}); nothing to recover"
        )
    units = ev.units()
    theta, dropped, history = _optimise(
        model, ev, units, full, empty, sparsity, budget, anneal, steps, lr, beta, init, progress
    )
    th, ended = _ended(theta, units, budget)
    hard = float(ev(ended[None]).mean())
    rank, scores = _path_rank(th, units, ended, dropped, budget, steps)
    order, value = order_units(graph, rank, units, select)
    settings = (
        {"sparsity": float(sparsity)}
        if budget is None
        else {"budget": float(budget), "anneal": float(anneal)}
    )
    settings |= {"steps": int(steps), "lr": float(lr), "beta": float(beta), "init": float(init)}
    meta = {"learned": _summary(settings, ended, history, hard, full, empty, len(ev.c), start)}
    return Ranking(
        graph=graph,
        order=order,
        value=value,
        rank=rank,
        scores=scores,
        span_names=names,
        select=select,
        method="learned",
        metric=resolve(metric)[0],
        meta=meta,
    )


def _check_settings(who, sparsity, lr, beta, steps, budget, anneal, select) -> None:
    for name, v, lo in (("sparsity", sparsity, 0.0), ("lr", lr, 1e-12), ("beta", beta, 1.0)):
        if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v) or v < lo:
            raise ValueError(f"{who}: {name} must be a finite number >= {lo:g}, got {v!r}")
    check_count(steps, "steps", 1, who)
    if budget is not None and not (isinstance(budget, int | float) and 0 < budget < 1):
        raise ValueError(
            f"{who}: budget must be a density strictly between 0 and 1, got {budget!r}"
        )
    if not isinstance(anneal, int | float) or isinstance(anneal, bool) or not 0 <= anneal <= 1:
        raise ValueError(f"{who}: anneal must be a share of the steps in [0, 1], got {anneal!r}")
    if select not in SELECTIONS:
        raise ValueError(
            f"{who}: select must be one of {', '.join(map(repr, SELECTIONS))}; got {select!r}"
        )


def _optimise(
    model, ev, units, full, empty, sparsity, budget, anneal, steps, lr, beta, init, progress
) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[float]]]:
    """The Adam steps on the mask logits (the model's own parameters frozen meanwhile): returns
    ``theta``, the step each unit was last dropped at (-1: kept; with ``budget`` only) and the
    curves per step."""
    graph = ev.graph
    device = ev.c.tokens.device
    unit_t = torch.as_tensor(units, device=device)
    frozen = [p for p in model.parameters() if p.requires_grad]
    history: dict[str, list[float]] = {"recovered": [], "density": [], "loss": []}
    if budget is not None:
        history["allowed"] = []
    hold = (
        int(anneal * steps) if budget is not None else 0
    )  # with a budget the masks sharpen once it is reached
    alive = unit_t.clone()
    dropped = torch.full(
        units.shape, -1, dtype=torch.long, device=device
    )  # the step a unit was last dropped at
    theta = torch.full(
        units.shape, float(init), dtype=model.W_E.dtype, device=device, requires_grad=True
    )
    opt = torch.optim.Adam([theta], lr=lr)
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="learn circuit", unit="step")
    try:
        for p in frozen:
            p.requires_grad_(False)
        with eval_mode(model):
            repl = ev.terms(torch.arange(len(ev.c), device=device))  # the corrupt run's terms
            for step in it:
                sharp = beta ** (max(0, step - hold) / max(1, steps - 1 - hold))
                if budget is None:
                    m = torch.where(unit_t, torch.sigmoid(theta * sharp), torch.ones_like(theta))
                else:  # the soft mask whose mean is the budget; tau differentiated implicitly
                    allowed = 1 - (1 - budget) * min(1.0, (step + 1) / max(1.0, anneal * steps))
                    soft, t0 = _budget_mask(theta[unit_t] * sharp, allowed)
                    m = torch.ones_like(theta).masked_scatter(unit_t, soft)
                    now = unit_t & (theta.detach() * sharp > t0)
                    history["allowed"].append(allowed)
                    dropped[alive & ~now] = step
                    dropped[now] = -1
                    alive = now
                per = ablated_metric(
                    model, graph, ev.c, repl, m[None], ev.fn, ev.good, ev.bad, ev.ids
                )
                rec = (per.mean() - empty) / (full - empty)
                density = m[unit_t].mean()
                loss = (1 - rec) ** 2 + (0.0 if budget is not None else sparsity * density)
                opt.zero_grad()
                loss.backward()
                opt.step()
                for k, v in (("recovered", rec), ("density", density), ("loss", loss)):
                    history[k].append(float(v.detach()))
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return theta, dropped, history


def _ended(theta: torch.Tensor, units: np.ndarray, budget) -> tuple[np.ndarray, np.ndarray]:
    """The logits (with ``budget`` shifted so that ``theta > 0`` is its circuit) and the circuit
    the optimisation ended on."""
    th = theta.detach().double().cpu().numpy()
    if budget is not None:  # the circuit of the last budget: theta > 0
        top = np.sort(th[units])[::-1]
        k = min(max(1, round(budget * len(top))), len(top) - 1)
        th = th - (top[k - 1] + top[k]) / 2
    return th, (th > 0) & units


def _summary(settings, ended, history, hard, full, empty, n_pairs, start) -> dict[str, Any]:
    """``meta["learned"]``: the settings, the circuit's size, its soft and hard faithfulness."""
    return {
        **settings,
        "size": int(ended.sum()),
        "recovered": history["recovered"][-1],
        "recovered_hard": (hard - empty) / (full - empty),
        "density": history["density"][-1],
        "history": history,
        "full": full,
        "empty": empty,
        "n_pairs": n_pairs,
        "seconds": time.perf_counter() - start,
    }


def _path_rank(th, units, ended, dropped, budget, steps) -> tuple[np.ndarray, dict[str, Any]]:
    """Each unit's rank (``sigmoid(theta)``; with ``budget`` its place on the path) and scores."""
    sig = 1 / (1 + np.exp(-th))
    scores = {"learned": np.where(units, th, np.nan)}
    if budget is None:
        rank = np.where(units, sig, np.nan)
    else:  # along the path: kept units in (1.5, 2), then dropped ones by step (ties by logit) in [0, 1]
        drop = np.where(
            ended, -1, np.where(dropped.cpu().numpy() < 0, steps, dropped.cpu().numpy())
        )
        rank = np.where(units, np.where(drop < 0, 1 + sig, (drop + sig) / steps), np.nan)
        scores["dropped"] = np.where(units, drop, np.nan)
    return rank, scores


def _budget_mask(x: torch.Tensor, density: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``sigmoid(x - tau)`` with ``tau`` such that its mean is ``density``, differentiable in
    ``x`` through ``tau`` too (implicitly: ``d tau / d x_u = s'_u / sum s'``), and ``tau``."""
    with torch.no_grad():
        t0 = _threshold(x, density).to(x.dtype)
        w = torch.sigmoid(x - t0) * torch.sigmoid(t0 - x)
    tau = t0 + (w * (x - x.detach())).sum() / w.sum().clamp_min(1e-30)  # its value is t0
    return torch.sigmoid(x - tau), t0


def _threshold(x: torch.Tensor, density: float, iters: int = 80) -> torch.Tensor:
    """The ``tau`` at which ``sigmoid(x - tau)`` averages ``density`` (bisection in float64; the
    mean falls as ``tau`` grows)."""
    x = x.detach().double()
    lo, hi = x.min() - 40.0, x.max() + 40.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if torch.sigmoid(x - mid).mean() > density else (lo, mid)
    return (lo + hi) / 2


__all__ = ["learn_ranking"]

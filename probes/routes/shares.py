"""Where position enters: each positional route's share of the model's positional effect.

Zero-ablating a head asks whether the head is *useful*. The single-head deposit is a claim about
*position*: that one head carries the shallow layers' positional work. This probe measures that.

A **route** is a place where the encoding gives the model position: a head whose queries and
keys are rotated (RoPE, decoupled RoPE) or whose logits get a positional bias (ALiBi, T5), in
its layer; and, for an absolute encoding, the residual stream (``"embed"``), which it enters
once. For a position-only counterfactual ``x'`` of ``x`` (the same tokens moved:
``x'[σ(i)] = x[i]``), the probe lets **one route at a time see the counterfactual positions σ**
(its rotation angles, bias entries or position vectors taken at ``σ(i)`` instead of ``i``) while
every other route sees the true ones, and measures how far the output moves::

    share_r = mean_i[ld(x_i) - ld(x_i; r sees σ_i)] / mean_i[ld(x_i) - ld(x_i; every route sees σ_i)]

with ``ld`` the logit of the clean label minus that of the counterfactual label. The denominator
is the model's **positional effect**: everything the encoding's positions do to the answer.
Where the rest of the model is blind to order (bidirectional attention, mean pooling) it equals
``ld(x) - ld(x')``; the result records the gap between the two (``identity_gap``). A head with no
positional input has share exactly 0 (the intervention is the identity there), so a planted
single route has share 1 and every other head 0. A head that only *moves* position written by an
earlier route is not a route: downstream readers are not confused with sources, as they are in
activation patching of head outputs. Routes can be redundant (each small, together large) or
synergistic (shares summing above 1); the shares are reported as measured.

The positional single-head deposit is decided on these shares in
:func:`probes.deposit.positional.positional_dominance`.

How it runs (:mod:`probes.routes.moving`): a head's route is a replacement of that head's output
by its output with the positions moved, so every head's route runs in the exact ablation sweep,
many per forward, at about the cost of an ablation grid on as many examples. With ``screen=k``
every head's share is first estimated by attribution and only the ``k`` largest are measured
exactly (:mod:`probes.routes.screen`); the result says which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from pe_interp.util.modes import eval_mode
from probes.ablation.request import default_batch_size
from probes.ablation.sweeps import Sweep, exact_sweep
from probes.common.inputs import (
    FiniteWatch,
    check_count,
    check_examples,
    check_finite_model,
    position_permutation,
    takes_probe_model,
)
from probes.common.metrics import Metric, bootstrap_ci
from probes.patching.sweep import logit_diff
from probes.routes.moving import (
    EMBED,
    MovedOutputs,
    can_move_positions,
    move_hooks,
    position_routes,
)
from probes.routes.result import RouteShares
from probes.routes.screen import MovedOnce, Screen, route_estimates, screened_heads

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

# A positional effect below this (mean logit difference) is no effect: it moves no answer's
# probability by more than ~2.5 points (a model blind to order scores ~1e-6, an untrained one
# ~1e-3), and shares of it are noise. The positional deposit is then "no", as the paper's
# criterion is for a model whose accuracy cannot drop 50 points.
NO_EFFECT = 0.1
FLOAT_NOISE = 1e-6  # below this the effect is float rounding, and no share is computed


__all__ = [
    "EMBED",
    "RouteShares",
    "can_move_positions",
    "position_permutation",
    "position_routes",
    "route_shares",
]


@torch.no_grad()
@takes_probe_model
def route_shares(
    model: ProbeModel,
    clean_tokens: Tensor,
    corrupt_tokens: Tensor,
    clean_labels: Tensor,
    corrupt_labels: Tensor,
    *,
    pad_mask: Tensor | None = None,
    batch_size: int | None = None,
    n_bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    screen: Screen | int | None = None,
    progress: bool = False,
) -> RouteShares:
    """Each positional route's share of the positional effect (module docstring), on position-only
    counterfactual pairs (``task.counterfactuals(n, kind="position")``; the pairs share
    ``pad_mask``). Each head's route runs as a replacement of its output in the exact ablation
    sweep (:mod:`probes.routes.moving`); ``batch_size``: rows per forward (default: as
    :func:`probes.ablate_heads`). ``screen``: a :class:`~probes.routes.screen.Screen` (``k``, an
    int, is ``Screen(k)``): every head's share estimated by attribution, the ``k`` largest measured
    exactly, the others NaN; None (default) measures every head. ``progress``: a bar with an ETA
    over the exact sweep."""
    who = "route_shares"
    clean, corrupt, good, bad, mask, sigma, screen = _check_routes(
        model,
        clean_tokens,
        corrupt_tokens,
        clean_labels,
        corrupt_labels,
        pad_mask,
        batch_size=batch_size,
        n_bootstrap=n_bootstrap,
        ci=ci,
        screen=screen,
    )
    extra, routes = position_routes(model)
    heads = [(int(a), int(h)) for a, h in zip(*np.nonzero(routes))]
    batch_size = default_batch_size(model) if batch_size is None else batch_size
    watch = FiniteWatch()
    with eval_mode(model):
        heads, estimates, ld_clean, ld_heads = _head_routes(
            model, clean, mask, good, bad, sigma, routes, heads, screen, batch_size, progress, watch
        )
        # the residual route and every route at once: whole forwards from the embedding
        whole = [EMBED] * bool(extra) + ["all"]
        ld_whole = _whole_routes(
            model, clean, mask, good, bad, sigma, routes, whole, batch_size, watch
        )
        _, key_valid = model.check_inputs(clean, mask)
        if ld_clean is None:
            ld_clean = (
                logit_diff(watch.see(model.forward_unchecked(clean, key_valid)), good, bad)
                .double()
                .cpu()
            )
        ld_cf = (
            logit_diff(watch.see(model.forward_unchecked(corrupt, key_valid)), good, bad)
            .double()
            .cpu()
        )
    watch.check(who, False)
    return _route_result(
        model,
        routes,
        heads + whole,
        torch.cat([ld_heads, ld_whole]),
        ld_clean,
        ld_cf,
        estimates,
        n_bootstrap=n_bootstrap,
        ci=ci,
        seed=seed,
    )


def _check_routes(
    model: ProbeModel,
    clean_tokens: Tensor,
    corrupt_tokens: Tensor,
    clean_labels: Tensor,
    corrupt_labels: Tensor,
    pad_mask: Tensor | None,
    *,
    batch_size: int | None,
    n_bootstrap: int,
    ci: float,
    screen: Screen | int | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Screen | None]:
    """Every check of :func:`route_shares`, before its first forward: ``(clean, corrupt, clean
    labels, corrupt labels, pad mask, the permutation σ, the screen)``."""
    who = "route_shares"
    check_finite_model(model, who)
    if batch_size is not None:
        check_count(batch_size, "batch_size", 1, who)
    check_count(n_bootstrap, "n_bootstrap", 0, who)
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")
    try:
        screen = Screen.of(screen)
    except ValueError as err:
        raise ValueError(f"{who}: {err}") from None
    clean, good, mask = check_examples(
        model, clean_tokens, clean_labels, pad_mask, who=who, label_name="clean_labels"
    )
    corrupt, bad, _ = check_examples(
        model,
        corrupt_tokens,
        corrupt_labels,
        pad_mask,
        who=who,
        what="corrupt_tokens",
        label_name="corrupt_labels",
    )
    if clean.shape[0] == 0:
        raise ValueError(f"{who}: no examples to evaluate")
    if bool((good == bad).all()):
        raise ValueError(
            f"{who}: every pair has one label, so position changes no answer here; use a task whose "
            "position-only counterfactuals change the label (distance, retrieve)"
        )
    try:
        sigma = position_permutation(clean, corrupt)
    except ValueError as err:
        raise ValueError(f"{who}: {err}") from None
    return clean, corrupt, good, bad, mask, sigma, screen


def _head_routes(
    model: ProbeModel,
    clean: Tensor,
    mask: Tensor,
    good: Tensor,
    bad: Tensor,
    sigma: Tensor,
    routes: np.ndarray,
    heads: list[tuple[int, int]],
    screen: Screen | None,
    batch_size: int,
    progress: bool,
    watch: FiniteWatch,
) -> tuple[list[tuple[int, int]], np.ndarray | None, Tensor | None, Tensor]:
    """Each head's route as a replacement of its output in the exact sweep (the ``screen``'s
    ``k`` largest estimates only, where it screens): ``(heads measured, estimates or None, the
    clean logit differences or None, [heads, n] with each head's positions moved)``."""
    n = len(clean)
    # the metric reads a row's pair of labels by its index (the sweep passes "labels" through)
    ld_of = Metric("logit difference", lambda logits, i: logit_diff(logits, good[i], bad[i]))
    moved = MovedOutputs(model, clean, mask, sigma, routes)
    estimates = None
    if screen is not None and screen.k < len(heads):
        moved = MovedOnce(moved, batch_size)
        estimates = route_estimates(
            model,
            clean,
            mask,
            good,
            bad,
            moved,
            path=screen.path,
            steps=screen.steps,
            batch_size=batch_size,
        )
        heads = screened_heads(estimates, routes, screen.k)
    if heads:  # each head's route as a replacement of its output in the exact sweep
        rows_of = torch.arange(n, device=clean.device)  # the metric reads each row's pair
        sweep = Sweep(
            model, clean, rows_of, mask, [(u,) for u in heads], ld_of, batch_size, progress
        )
        ld_clean, ld_heads = exact_sweep(sweep, moved, watch)
    else:
        ld_clean, ld_heads = None, torch.empty(0, n, dtype=torch.float64)
    return heads, estimates, ld_clean, ld_heads


def _whole_routes(
    model: ProbeModel,
    clean: Tensor,
    mask: Tensor,
    good: Tensor,
    bad: Tensor,
    sigma: Tensor,
    routes: np.ndarray,
    whole: list[str],
    batch_size: int,
    watch: FiniteWatch,
) -> Tensor:
    """``[len(whole), n]`` logit differences with the residual route (``EMBED``) or every route
    (``"all"``) seeing the moved positions: whole forwards from the embedding."""
    n = len(clean)
    extra = whole[0] == EMBED
    _, key_valid = model.check_inputs(clean, mask)
    ld_whole = torch.empty(len(whole), n, dtype=torch.float64)
    for r0 in range(0, n, batch_size):
        rows = slice(r0, min(n, r0 + batch_size))
        for i, u in enumerate(whole):
            moved = torch.as_tensor(routes, device=clean.device) & (u == "all")
            layer_heads = moved[None].expand(rows.stop - rows.start, -1, -1)
            embed = torch.full((rows.stop - rows.start,), bool(extra), device=clean.device)
            kv = None if key_valid is None else key_valid[rows]
            with model.hooks(fwd_hooks=move_hooks(model, sigma[rows], layer_heads, embed, 0)):
                logits = watch.see(model.forward_unchecked(clean[rows], kv))
            ld_whole[i, rows] = logit_diff(logits, good[rows], bad[rows]).double().cpu()
    return ld_whole


def _route_result(
    model: ProbeModel,
    routes: np.ndarray,
    units: list,
    ld: Tensor,
    ld_clean: Tensor,
    ld_cf: Tensor,
    estimates: np.ndarray | None,
    *,
    n_bootstrap: int,
    ci: float,
    seed: int,
) -> RouteShares:
    """The shares of the measured routes (``ld``: one row per unit, ``"all"`` last) with their
    bootstrap intervals, as a :class:`RouteShares`."""
    n = ld.shape[1]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    ld_all = ld[-1]
    denom = ld_clean - ld_all
    numer = ld_clean[None] - ld[:-1]
    effect = float(denom.mean())
    e_lo, e_hi = bootstrap_ci(denom[None], None, n_bootstrap=n_bootstrap, ci=ci, seed=seed)
    if (
        abs(effect) < FLOAT_NOISE
    ):  # blind to order: no effect to share out (shares of rounding noise)
        values, lo, hi = (
            np.zeros(len(units) - 1),
            np.zeros(len(units) - 1),
            np.zeros(len(units) - 1),
        )
    else:
        values = (numer.mean(1) / denom.mean()).numpy()
        lo, hi = bootstrap_ci(numer, denom, n_bootstrap=n_bootstrap, ci=ci, seed=seed)
        if n_bootstrap == 0:
            lo, hi = values.copy(), values.copy()
    grids = [np.zeros((L, H)) for _ in range(3)]
    if estimates is not None:  # the heads not measured have no share, only an estimate
        for grid in grids:
            grid[routes] = np.nan
    embed_vals = None
    for i, u in enumerate(units[:-1]):
        if u == EMBED:
            embed_vals = (float(values[i]), (float(lo[i]), float(hi[i])))
        else:
            for grid, v in zip(grids, (values, lo, hi)):
                grid[u] = v[i]
    return RouteShares(
        shares=grids[0],
        ci_low=grids[1],
        ci_high=grids[2],
        routes=routes,
        embed=None if embed_vals is None else embed_vals[0],
        embed_ci=None if embed_vals is None else embed_vals[1],
        effect=effect,
        effect_ci=(float(e_lo[0]), float(e_hi[0])),
        estimates=None
        if estimates is None
        else np.where(routes, estimates / effect if abs(effect) >= FLOAT_NOISE else 0.0, 0.0),
        counterfactual_effect=float((ld_clean - ld_cf).mean()),
        identity_gap=float((ld_all - ld_cf).abs().mean()),
        n_examples=n,
        n_bootstrap=n_bootstrap,
        ci=ci,
        seed=seed,
    )

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

**Positional single-head deposit** (:func:`positional_dominance`, the one definition): one route
carries at least :data:`~probes.deposit.dominance.LARGE_DROP` (50%) of the positional effect and
every other route at most :data:`~probes.deposit.dominance.SMALL_DROP` (5%) either way: the
paper's 50 and 5 points, in units of the positional effect instead of accuracy. It is decided
on the bootstrap intervals: "yes" when the top route's interval lies above 50% and every other
route's inside ±5%, "no" when the top route's lies below 50% or another's outside ±5% (or when
the model has no positional effect: less than :data:`NO_EFFECT`, 0.1 logits, or when the top
route is the residual stream: a deposit is a head, and an absolute encoding enters none of its
own, so there this criterion cannot localise), and "undecided" otherwise.

How it runs (:mod:`probes.deposit.moving`): a head's route is a replacement of that head's output
by its output with the positions moved, so every head's route runs in the exact ablation sweep,
many per forward, at about the cost of an ablation grid on as many examples. With ``screen=k``
every head's share is first estimated by attribution and only the ``k`` largest are measured
exactly (:mod:`probes.deposit.route_screen`); the result says which.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pe_interp.modes import eval_mode
from probes.ablation.plan import check_request
from probes.ablation.request import default_batch_size
from probes.ablation.sweeps import sweep_batched, sweep_stacked
from probes.deposit.dominance import LARGE_DROP, SMALL_DROP
from probes.deposit.moving import (
    EMBED,
    MovedOutputs,
    can_move_positions,
    move_hooks,
    position_routes,
)
from probes.deposit.route_result import RouteShares
from probes.deposit.route_screen import MovedOnce, route_estimates, screened_heads
from probes.inputs import (
    FiniteWatch,
    check_count,
    check_examples,
    check_finite_model,
    position_permutation,
    takes_probe_model,
)
from probes.metrics import Metric, bootstrap_ci
from probes.patching import logit_diff

# A positional effect below this (mean logit difference) is no effect: it moves no answer's
# probability by more than ~2.5 points (a model blind to order scores ~1e-6, an untrained one
# ~1e-3), and shares of it are noise. The positional deposit is then "no", as the paper's
# criterion is for a model whose accuracy cannot drop 50 points.
NO_EFFECT = 0.1
FLOAT_NOISE = 1e-6  # below this the effect is float rounding, and no share is computed


__all__ = [
    "EMBED",
    "PositionalDominance",
    "RouteShares",
    "can_move_positions",
    "position_permutation",
    "position_routes",
    "positional_dominance",
    "route_shares",
]


@torch.no_grad()
@takes_probe_model
def route_shares(
    model,
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
    screen: int | None = None,
    screen_path: str = "clean",
    screen_steps: int = 1,
    progress: bool = False,
) -> RouteShares:
    """Each positional route's share of the positional effect (module docstring), on position-only
    counterfactual pairs (``task.counterfactuals(n, kind="position")``; the pairs share
    ``pad_mask``). Each head's route runs as a replacement of its output in the exact ablation
    sweep (:mod:`probes.deposit.moving`); ``batch_size``: rows per forward (default: as
    :func:`probes.ablate_heads`). ``screen=k``: every head's share estimated by attribution
    (``screen_path`` "clean": its derivative with every route live; "joint": integrated over
    ``screen_steps`` nodes), the ``k`` largest measured exactly, the others NaN
    (:mod:`probes.deposit.route_screen`); None (default) measures every head. ``progress``: a
    bar with an ETA over the exact sweep."""
    who = "route_shares"
    check_finite_model(model, who)
    if batch_size is not None:
        check_count(batch_size, "batch_size", 1, who)
    check_count(n_bootstrap, "n_bootstrap", 0, who)
    if screen is not None:
        check_count(screen, "screen", 1, who)
        check_count(screen_steps, "screen_steps", 1, who)
        if screen_path not in ("clean", "joint") or (screen_path == "clean" and screen_steps != 1):
            raise ValueError(
                f"{who}: screen_path must be 'clean' (steps 1) or 'joint', got {screen_path!r} "
                f"with {screen_steps} steps"
            )
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
    if bool((good == bad).all()):
        raise ValueError(
            f"{who}: every pair has one label, so position changes no answer here; use a task whose "
            "position-only counterfactuals change the label (distance, retrieve)"
        )
    try:
        sigma = position_permutation(clean, corrupt)
    except ValueError as err:
        raise ValueError(f"{who}: {err}") from None
    extra, routes = position_routes(model)
    heads = [(int(a), int(h)) for a, h in zip(*np.nonzero(routes))]
    n = len(clean)
    batch_size = default_batch_size(model) if batch_size is None else batch_size
    watch = FiniteWatch()
    # the metric reads a row's pair of labels by its index (the sweep passes "labels" through)
    ld_of = Metric("logit difference", lambda logits, i: logit_diff(logits, good[i], bad[i]))
    with eval_mode(model):
        moved = MovedOutputs(model, clean, mask, sigma, routes)
        estimates = None
        if screen is not None and screen < len(heads):
            moved = MovedOnce(moved, batch_size)
            estimates = route_estimates(
                model,
                clean,
                mask,
                good,
                bad,
                moved,
                path=screen_path,
                steps=screen_steps,
                batch_size=batch_size,
            )
            heads = screened_heads(estimates, routes, screen)
        if heads:  # each head's route as a replacement in the exact sweep, checked as any sweep is
            req = check_request(
                model,
                clean,
                None,
                pad_mask=mask,
                metric=ld_of,
                head_sets=[(u,) for u in heads],
                n_bootstrap=0,
                ci=ci,
                seed=seed,
                batch_size=batch_size,
                who=who,
                rows=True,
                progress=progress,
            )
            sweep = sweep_batched if model.can_restart else sweep_stacked
            ld_clean, ld_heads = sweep(req, watch, moved)
        else:
            ld_clean, ld_heads = None, torch.empty(0, n, dtype=torch.float64)
        # the residual route and every route at once: whole forwards from the embedding
        _, key_valid = model.check_inputs(clean, mask)
        whole = [EMBED] * bool(extra) + ["all"]
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
    ld, units = torch.cat([ld_heads, ld_whole]), heads + whole
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


@dataclass(frozen=True)
class PositionalDominance:
    """The positional single-head deposit verdict of one :class:`RouteShares` ("yes", "no" or
    "undecided"), with the numbers behind it."""

    verdict: str
    top: str  # the route with the largest share ("" without any)
    share: float
    ci: tuple[float, float]
    runner_up: str
    runner_up_share: float
    others_max_abs: float
    why: str
    n_examples: int = 0
    need: int | None = None  # pairs that would decide an undecided verdict (None: unknown)

    @property
    def single(self) -> bool:
        return self.verdict == "yes"

    @property
    def decided(self) -> str:
        """The verdict as the decided verdicts print it: ``undecided (n = ..., need >= ...)``."""
        if self.verdict != "undecided":
            return self.verdict
        return f"undecided (n = {self.n_examples:,}, " + (
            f"need ≥ {self.need:,})" if self.need else "more pairs needed)"
        )

    def text(self) -> str:
        if not self.top:
            return f"positional deposit: {self.verdict} ({self.why})"
        second = (
            f"runner-up {self.runner_up} {100 * self.runner_up_share:.0f}%"
            if self.runner_up
            else "the only route"
        )
        return (
            f"positional deposit: {self.decided} — top route {self.top} carries {100 * self.share:.0f}% "
            f"[{100 * self.ci[0]:.0f}, {100 * self.ci[1]:.0f}] of the positional effect, {second} ({self.why})"
        )


def positional_dominance(r: RouteShares) -> PositionalDominance:
    """The one definition of a positional single-head deposit (module docstring)."""
    from probes.deposit.decision import examples_needed, min_examples

    units = r.units()
    floor = min_examples(
        r.ci, SMALL_DROP
    )  # a bootstrap over fewer pairs cannot decide (decision.py)
    few = f"a bootstrap over {r.n_examples} pairs cannot bound a share to {100 * SMALL_DROP:.0f}%"
    if abs(r.effect) < NO_EFFECT or not units:  # no interval decides this: the effect is nil
        why = f"no positional effect ({r.effect:.2g} logits)"
        return PositionalDominance("no", "", 0.0, (0.0, 0.0), "", 0.0, 0.0, why, r.n_examples)
    (top, share, lo, hi), others = units[0], units[1:]
    worst = max((max(abs(o[2]), abs(o[3])) for o in others), default=0.0)
    clear_out = [o for o in others if o[2] > SMALL_DROP or o[3] < -SMALL_DROP]
    if top == EMBED and lo >= LARGE_DROP:
        verdict, why = (
            "no",
            "the residual stream carries it: an absolute encoding enters no head of its own",
        )
    elif hi < LARGE_DROP:
        verdict, why = "no", f"the top route's interval lies below {100 * LARGE_DROP:.0f}%"
    elif clear_out:
        verdict, why = "no", f"{clear_out[0][0]}'s share lies outside ±{100 * SMALL_DROP:.0f}%"
    elif lo >= LARGE_DROP and worst <= SMALL_DROP:
        verdict, why = "yes", f"every other route within ±{100 * SMALL_DROP:.0f}%"
    else:
        verdict, why = "undecided", "the intervals reach across a threshold"
    need = None
    if others and r.n_examples < floor:  # with one route its share is 1 whatever n is
        verdict, why, need = "undecided", few, floor
    elif verdict == "undecided":
        open_ = [(share, lo, hi, LARGE_DROP)] if lo < LARGE_DROP else []
        open_ += [
            (o[1], o[2], o[3], SMALL_DROP if o[1] >= 0 else -SMALL_DROP)
            for o in others
            if o[3] > SMALL_DROP or o[2] < -SMALL_DROP
        ]
        needs = [examples_needed(r.n_examples, *x) for x in open_]
        need = None if not needs or None in needs else max(needs)
    if r.screened:  # decided on the measured routes; an estimate alone never makes it a yes
        rest = r.unmeasured_max()
        if verdict == "yes" and rest > SMALL_DROP:
            verdict, why = "undecided", "a route not measured has an estimated share outside ±5%"
        why += (
            f"; screened: {int(r.measured.sum())} of {int(r.routes.sum())} routes measured "
            f"exactly, the others' estimated shares within ±{100 * rest:.1f}%"
        )
    runner = others[0] if others else ("", 0.0, 0.0, 0.0)
    return PositionalDominance(
        verdict,
        top,
        share,
        (lo, hi),
        runner[0],
        runner[1],
        max((abs(o[1]) for o in others), default=0.0),
        why,
        r.n_examples,
        need,
    )

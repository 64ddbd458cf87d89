"""The positional single-head deposit: its one definition, decided on route shares
(:func:`probes.routes.route_shares`).

**Positional single-head deposit** (:func:`positional_dominance`, the one definition): one route
carries at least :data:`~probes.deposit.dominance.LARGE_DROP` (50%) of the positional effect and
every other route at most :data:`~probes.deposit.dominance.SMALL_DROP` (5%) either way: the
paper's 50 and 5 points, in units of the positional effect instead of accuracy. It is decided
on the bootstrap intervals: "yes" when the top route's interval lies above 50% and every other
route's inside ±5%, "no" when the top route's lies below 50% or another's outside ±5% (or when
the model has no positional effect: less than :data:`NO_EFFECT`, 0.1 logits, or when the top
route is the residual stream: a deposit is a head, and an absolute encoding enters none of its
own, so there this criterion cannot localise), and "undecided" otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.deposit.decision import examples_needed, min_examples
from probes.deposit.dominance import LARGE_DROP, SMALL_DROP
from probes.routes.moving import EMBED
from probes.routes.result import RouteShares
from probes.routes.shares import NO_EFFECT

__all__ = ["PositionalDominance", "positional_dominance"]


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

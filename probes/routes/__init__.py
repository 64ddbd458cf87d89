"""Where position enters a model: each positional route's share of its positional effect
(:func:`route_shares`), the interventions that move one route's positions
(:mod:`probes.routes.moving`), and the attribution screen that measures only the largest routes
exactly (:mod:`probes.routes.screen`). The verdict on these shares, the positional single-head
deposit, lives with the other deposit definitions (:mod:`probes.deposit.positional`)."""

from probes.routes.moving import EMBED, can_move_positions, position_routes
from probes.routes.result import RouteShares
from probes.routes.screen import Screen
from probes.routes.shares import NO_EFFECT, route_shares

__all__ = [
    "EMBED",
    "NO_EFFECT",
    "RouteShares",
    "Screen",
    "can_move_positions",
    "position_routes",
    "route_shares",
]

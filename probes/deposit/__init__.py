"""The single-head deposit pattern: its one definition (:mod:`probes.deposit.dominance`), the
looser per-layer flag, layer concentration (:mod:`probes.deposit.detection`), the positional
deposit, which asks where position enters (:mod:`probes.routes.shares`), verdicts decided on
intervals (:mod:`probes.deposit.decision`), and watching them form during training
(:mod:`probes.deposit.dynamics`, a callback; :mod:`probes.deposit.trajectory`, every snapshot)."""

from probes.deposit.decision import (
    Decision,
    decide_concentration,
    decide_single,
    min_examples,
    too_few,
)
from probes.deposit.detection import (
    DEFAULT_MIN_DROP_ACCURACY,
    DEFAULT_MIN_SHARE,
    ConcentrationReport,
    DepositReport,
    LayerConcentration,
    LayerDeposit,
    find_concentrations,
    find_deposits,
    layer_stats,
    normalized_entropy,
    normalized_gini,
)
from probes.deposit.dominance import LARGE_DROP, SMALL_DROP, Dominance, at_least, at_most, dominance
from probes.deposit.dynamics import DYNAMICS_FILE, DepositDynamics, dynamics_arrays, load_dynamics
from probes.deposit.positional import PositionalDominance, positional_dominance
from probes.deposit.trajectory import PAIRS_SEED_OFFSET, SnapshotDynamics, snapshot_dynamics
from probes.routes import RouteShares, can_move_positions, route_shares

__all__ = [
    "DEFAULT_MIN_DROP_ACCURACY",
    "PAIRS_SEED_OFFSET",
    "DEFAULT_MIN_SHARE",
    "DYNAMICS_FILE",
    "ConcentrationReport",
    "Decision",
    "PositionalDominance",
    "RouteShares",
    "SnapshotDynamics",
    "decide_concentration",
    "decide_single",
    "min_examples",
    "too_few",
    "can_move_positions",
    "positional_dominance",
    "route_shares",
    "snapshot_dynamics",
    "DepositDynamics",
    "DepositReport",
    "Dominance",
    "LARGE_DROP",
    "SMALL_DROP",
    "at_least",
    "at_most",
    "dominance",
    "LayerConcentration",
    "LayerDeposit",
    "dynamics_arrays",
    "find_concentrations",
    "find_deposits",
    "layer_stats",
    "load_dynamics",
    "normalized_entropy",
    "normalized_gini",
]

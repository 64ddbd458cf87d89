"""The single-head deposit pattern: its one definition (:mod:`probes.deposit.dominance`), the
looser per-layer flag, layer concentration (:mod:`probes.deposit.detection`), and watching them
form during training (:mod:`probes.deposit.dynamics`)."""

from probes.deposit.detection import (
    DEFAULT_MIN_DROP_ACCURACY,
    DEFAULT_MIN_SHARE,
    DepositReport,
    LayerDeposit,
    find_deposits,
    layer_stats,
    normalized_entropy,
    normalized_gini,
)
from probes.deposit.dominance import LARGE_DROP, SMALL_DROP, Dominance, at_least, at_most, dominance
from probes.deposit.dynamics import DYNAMICS_FILE, DepositDynamics, dynamics_arrays, load_dynamics

__all__ = [
    "DEFAULT_MIN_DROP_ACCURACY",
    "DEFAULT_MIN_SHARE",
    "DYNAMICS_FILE",
    "DepositDynamics",
    "DepositReport",
    "Dominance",
    "LARGE_DROP",
    "SMALL_DROP",
    "at_least",
    "at_most",
    "dominance",
    "LayerDeposit",
    "dynamics_arrays",
    "find_deposits",
    "layer_stats",
    "load_dynamics",
    "normalized_entropy",
    "normalized_gini",
]

"""The single-head deposit pattern: detecting it in an ablation sweep
(:mod:`probes.deposit.detection`) and watching it form during training
(:mod:`probes.deposit.dynamics`)."""

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
from probes.deposit.dynamics import DYNAMICS_FILE, DepositDynamics, dynamics_arrays, load_dynamics

__all__ = [
    "DEFAULT_MIN_DROP_ACCURACY",
    "DEFAULT_MIN_SHARE",
    "DYNAMICS_FILE",
    "DepositDynamics",
    "DepositReport",
    "LayerDeposit",
    "dynamics_arrays",
    "find_deposits",
    "layer_stats",
    "load_dynamics",
    "normalized_entropy",
    "normalized_gini",
]

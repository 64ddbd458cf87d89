"""Probes: pure functions of a model and data that return frozen result objects.

- :mod:`probes.ablation`: head ablation sweeps (zero, mean, resample): one entry, one input check
  (:mod:`probes.ablation.plan`), one room per engine: batched and exact
  (:mod:`probes.ablation.exact`), and the cheaper engines that end in exact ablation
  (:mod:`probes.ablation.sampled`, :mod:`probes.ablation.attribution`).
- :mod:`probes.deposit`: the single-head deposit (``dominance``), layer concentration
  (``find_concentrations``, also known as ``find_deposits``), the positional deposit
  (``route_shares``, ``positional_dominance``: where position enters), verdicts decided on their
  intervals, and their dynamics during training (``snapshot_dynamics``: every snapshot).
- :mod:`probes.patching`: activation patching over heads, positions, q/k/v, pattern, residual.
- :mod:`probes.decomposition`: attention-logit terms, Toeplitz score, positional score per head.
- :mod:`probes.gradients`: gradient coherence per head at initialisation (the "seed").
- :mod:`probes.patterns`: attention patterns of chosen heads.
- :mod:`probes.head_types`: previous-token, duplicate-token, induction and first-token (sink)
  heads, every head scored at once on batches of prompts (equal to TransformerLens' ``detect_head``).
- :mod:`probes.generalization`: accuracy on longer inputs than training (translated, lengthened).
- :mod:`probes.circuits`: attribution patching (AtP, AtP*, EAP-IG) of nodes and edges, exact
  path patching, connected and position-aware circuits, their faithfulness, the exact (ACDC)
  reference, heads ranked along the ablation path, the circuit graph view.
- :mod:`probes.plots`, :mod:`probes.viz`: matplotlib figures and offline circuitsvis HTML.

Each result saves and loads itself (``save``/``load``, ``to_dict``/``from_dict``) through
:mod:`pe_interp.io`. Probes run the model's own forward (its seams: ``start_at_layer``,
``start_at="resid_mid"``, ``forward_unchecked``) and ask the encoding what is encoding-specific.
"""

from probes.ablation import AblationResult, ablate_heads, ablate_heads_naive, keep_only
from probes.circuits import (
    Attribution,
    Circuit,
    PathPatch,
    attribute,
    circuit,
    faithfulness_curve,
    family_attributions,
    path_patch,
)
from probes.decomposition import (
    FrequencyUsage,
    LogitTerms,
    PositionalScores,
    RopeTerms,
    frequency_usage,
    logit_terms,
    positional_scores,
    toeplitz_score,
)
from probes.deposit import (
    ConcentrationReport,
    DepositDynamics,
    DepositReport,
    Dominance,
    LayerConcentration,
    LayerDeposit,
    RouteShares,
    SnapshotDynamics,
    dominance,
    find_concentrations,
    find_deposits,
    load_dynamics,
    positional_dominance,
    route_shares,
    snapshot_dynamics,
)
from probes.generalization import Condition, GeneralizationResult, length_generalization, widened
from probes.gradients import (
    QK_PARAMS,
    CoherenceResult,
    coherence_report,
    format_coherence_report,
    gradient_coherence,
    load_coherence,
    save_coherence,
)
from probes.head_type_plots import plot_head_types
from probes.head_types import DEFAULT_THRESHOLDS, HEAD_TYPES, HeadTypeScores, head_type_scores
from probes.patching import SITES, PatchResult, normalized_logit_diff_metric, patch
from probes.patterns import AttentionPatterns, attention_patterns

__all__ = [
    "FrequencyUsage",
    "frequency_usage",
    "DEFAULT_THRESHOLDS",
    "HEAD_TYPES",
    "HeadTypeScores",
    "head_type_scores",
    "plot_head_types",
    "AblationResult",
    "AttentionPatterns",
    "Condition",
    "GeneralizationResult",
    "Attribution",
    "Circuit",
    "CoherenceResult",
    "ConcentrationReport",
    "DepositDynamics",
    "DepositReport",
    "Dominance",
    "LayerConcentration",
    "LayerDeposit",
    "RouteShares",
    "SnapshotDynamics",
    "positional_dominance",
    "route_shares",
    "snapshot_dynamics",
    "LogitTerms",
    "PatchResult",
    "PathPatch",
    "PositionalScores",
    "QK_PARAMS",
    "RopeTerms",
    "SITES",
    "ablate_heads",
    "ablate_heads_naive",
    "attention_patterns",
    "attribute",
    "circuit",
    "coherence_report",
    "faithfulness_curve",
    "family_attributions",
    "dominance",
    "find_concentrations",
    "find_deposits",
    "format_coherence_report",
    "gradient_coherence",
    "keep_only",
    "length_generalization",
    "widened",
    "load_coherence",
    "load_dynamics",
    "logit_terms",
    "normalized_logit_diff_metric",
    "patch",
    "path_patch",
    "positional_scores",
    "save_coherence",
    "toeplitz_score",
]

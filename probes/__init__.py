"""Probes: functions of a model (any :class:`~pe_interp.models.protocol.ProbeModel`) and data that
return frozen results which save and load themselves.

- :mod:`probes.common`: what every probe shares: input checks, options, metrics, progress bars,
  the one replacement seam (zero, mean, resample, the corrupt run; keyed by hook name, for heads
  and edges alike), figures and offline HTML.
- :mod:`probes.ablation`: head ablation sweeps (zero, mean, resample): one entry, one input check
  (:mod:`probes.ablation.plan`), one room per engine (batched and exact, sampled, attribution),
  and heads ranked along the ablation path (:mod:`probes.ablation.ranking`).
- :mod:`probes.patching`: activation patching over heads, positions, q/k/v, pattern, residual.
- :mod:`probes.routes`: where position enters: each positional route's share of the effect.
- :mod:`probes.deposit`: the single-head deposit (``dominance``), layer concentration, the
  positional deposit decided on route shares (``positional_dominance``), verdicts on intervals,
  and their dynamics during training.
- :mod:`probes.decomposition`: attention-logit terms, Toeplitz score, positional score per head,
  RoPE frequency usage.
- :mod:`probes.heads`: head types (previous-token, duplicate, induction, first-token; equal to
  TransformerLens' ``detect_head``) and attention patterns of chosen heads.
- :mod:`probes.gradients`: per-head gradients and their coherence at initialisation (the "seed").
- :mod:`probes.circuits`: attribution patching (AtP, AtP*, EAP-IG) of nodes and edges, exact
  path patching, connected and position-aware circuits, their faithfulness, the exact (ACDC)
  reference, the circuit graph view.
- :mod:`probes.generalization`: accuracy on longer inputs than training (translated, lengthened).

Each package draws its own figures in a ``view`` module. Results save and load themselves through
:mod:`pe_interp.util.io`. Probes run the model's own forward (its seams: ``start_at_layer``,
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
from probes.gradients.coherence import (
    QK_PARAMS,
    CoherenceResult,
    coherence_report,
    format_coherence_report,
    gradient_coherence,
    load_coherence,
    save_coherence,
)
from probes.heads.patterns import AttentionPatterns, attention_patterns
from probes.heads.types import DEFAULT_THRESHOLDS, HEAD_TYPES, HeadTypeScores, head_type_scores
from probes.heads.view import plot_head_types
from probes.patching.sweep import SITES, PatchResult, normalized_logit_diff_metric, patch

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

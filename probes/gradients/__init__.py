"""Gradients per head: each head's slice of the weights and per-example gradients
(:mod:`~probes.gradients.per_head`), and their coherence at initialisation, the positional "seed"
(:mod:`~probes.gradients.coherence`)."""

from probes.gradients.coherence import (
    QK_PARAMS,
    CoherenceResult,
    coherence_report,
    format_coherence_report,
    gradient_coherence,
    load_coherence,
    save_coherence,
)

__all__ = [
    "QK_PARAMS",
    "CoherenceResult",
    "coherence_report",
    "format_coherence_report",
    "gradient_coherence",
    "load_coherence",
    "save_coherence",
]

"""Activation patching: the sweep over sites (:mod:`~probes.patching.sweep`), its cells
(:mod:`~probes.patching.cells`), metrics (:mod:`~probes.patching.metric`), result
(:mod:`~probes.patching.result`) and views (:mod:`~probes.patching.view`)."""

from probes.patching.result import RESULT_KIND, PatchResult
from probes.patching.sweep import SITES, logit_diff, normalized_logit_diff_metric, patch

__all__ = [
    "RESULT_KIND",
    "SITES",
    "PatchResult",
    "logit_diff",
    "normalized_logit_diff_metric",
    "patch",
]

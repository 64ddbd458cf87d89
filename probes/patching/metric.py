"""The metric of activation patching and its interval: the logit difference between the clean and
the corrupt label per example, TransformerLens' normalised form of it (1 for the clean run, 0 for
the corrupt one), and the percentile-bootstrap interval of a ratio of means.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from probes.common.metrics import bootstrap_ci, logit_diff

__all__ = ["bootstrap_ratio_ci", "logit_diff", "normalized_logit_diff_metric"]


def bootstrap_ratio_ci(
    numer: Tensor, denom: Tensor | None, n_bootstrap: int, seed: int, level: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Percentile-bootstrap interval of ``mean(numer) / mean(denom)`` (or of ``mean(numer)``):
    :func:`probes.common.metrics.bootstrap_ci`, as tensors of ``numer``'s dtype and device.

    ``numer``: ``[..., n]`` per-example values; ``denom``: ``[n]`` or None. All cells share the same
    resamples of the examples.
    """
    lo, hi = bootstrap_ci(numer, denom, n_bootstrap=n_bootstrap, ci=level, seed=seed)
    return (
        torch.as_tensor(lo, device=numer.device).to(numer.dtype),
        torch.as_tensor(hi, device=numer.device).to(numer.dtype),
    )


def normalized_logit_diff_metric(
    clean_logits: Tensor, corrupt_logits: Tensor, clean_labels: Tensor, corrupt_labels: Tensor
) -> Callable[[Tensor], Tensor]:
    """A scalar TransformerLens-style metric equal to :func:`probes.patching.sweep.patch`'s default metric."""
    ld_clean = logit_diff(clean_logits, clean_labels, corrupt_labels).mean()
    ld_corrupt = logit_diff(corrupt_logits, clean_labels, corrupt_labels).mean()

    def metric(logits: Tensor) -> Tensor:
        return (logit_diff(logits, clean_labels, corrupt_labels).mean() - ld_corrupt) / (
            ld_clean - ld_corrupt
        )

    return metric

"""The inputs and metrics the circuit probes share: runs, clean/corrupt pairs, per-example metrics.

A :class:`Run` holds a batch's tokens, key mask, pad mask and labels (:func:`as_run` checks and
builds one, :func:`as_pair` the clean run and its corrupt partner, :func:`pair_labels` their
labels); :data:`METRICS` maps a metric's name to ``fn(logits [n, C], clean labels [n], corrupt
labels [n]) -> [n]``, differentiable, and :func:`resolve` turns a name or a callable into one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from probes.common.inputs import check_examples
from probes.common.metrics import logit_diff, margin

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["METRICS", "PerExample", "Run", "as_pair", "as_run", "pair_labels", "resolve"]


PerExample = Callable[[Tensor, Tensor, Tensor], Tensor]


# ---------------------------------------------------------------------------------------------
# metrics: logits [n, C], clean labels [n], corrupt labels [n] -> [n], differentiable
# ---------------------------------------------------------------------------------------------
def _logprob(logits: Tensor, good: Tensor, bad: Tensor) -> Tensor:
    return logits.log_softmax(-1).gather(1, good[:, None])[:, 0]


def _logit(logits: Tensor, good: Tensor, bad: Tensor) -> Tensor:
    return logits.gather(1, good[:, None])[:, 0]


def _margin(logits: Tensor, good: Tensor, bad: Tensor) -> Tensor:
    """The clean label's logit minus the largest other logit (> 0 exactly when it is predicted)."""
    return margin(logits, good)


METRICS: dict[str, PerExample] = {
    "logit_diff": logit_diff,
    "logprob": _logprob,
    "logit": _logit,
    "margin": _margin,
}


def resolve(metric: str | PerExample) -> tuple[str, PerExample]:
    """``(name, fn)`` of a built-in metric name or a callable ``fn(logits, clean_labels,
    corrupt_labels) -> [n]``."""
    if isinstance(metric, str):
        if metric not in METRICS:
            raise ValueError(
                f"unknown metric {metric!r}; expected one of {', '.join(METRICS)} or a callable"
            )
        return metric, METRICS[metric]
    if callable(metric):
        return getattr(metric, "__name__", "custom"), metric
    raise ValueError(f"metric must be a name or a callable, got {metric!r}")


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Checked inputs of one side (clean or corrupt): int64 tokens, the model's key mask (None
    when every key is real), the pad mask and the labels, on the model's device."""

    tokens: Tensor
    key_valid: Tensor | None
    pad_mask: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def rows(self, sl: slice) -> Run:
        kv = None if self.key_valid is None else self.key_valid[sl]
        return Run(self.tokens[sl], kv, self.pad_mask[sl], self.labels[sl])


def as_run(
    model: ProbeModel, x: Any, labels: Tensor | None = None, what: str = "clean", who: str = ""
) -> Run:
    """A :class:`Run` from a ``Batch`` (tokens, labels, pad_mask) or a token tensor (then
    ``labels`` default to zeros: pass them for the built-in metrics), checked
    (:func:`probes.common.inputs.check_examples`; ``who`` prefixes the message)."""
    if hasattr(x, "tokens") and hasattr(x, "pad_mask"):
        tokens, pad_mask = x.tokens, x.pad_mask
        labels = x.labels if labels is None else labels
    elif isinstance(x, Tensor):
        tokens, pad_mask = x, None
    else:
        raise ValueError(
            f"{who + ': ' if who else ''}{what} must be a Batch or a [batch, pos] token tensor, "
            f"got {type(x).__name__}"
        )
    if getattr(tokens, "ndim", None) == 2 and tokens.shape[0] == 0:
        raise ValueError(
            f"{who + ': ' if who else ''}{what}.tokens must be a non-empty [batch, pos] tensor, "
            f"got {tuple(tokens.shape)}"
        )
    tokens, labels, pad_mask = check_examples(
        model, tokens, labels, pad_mask, who=who, what=f"{what}.tokens", label_name=f"{what}.labels"
    )
    key_valid = model.check_inputs(tokens, pad_mask)[1]
    if labels is None:
        labels = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    return Run(tokens, key_valid, pad_mask, labels)


def as_pair(model: ProbeModel, clean: Any, corrupt: Any, who: str = "") -> tuple[Run, Run | None]:
    """Clean and corrupt runs from ``(CounterfactualPairs, None)``, ``(Batch, Batch)``,
    ``(tokens, tokens)`` or ``(Batch, None)`` (no corrupt run)."""
    if hasattr(clean, "clean") and hasattr(clean, "corrupt"):
        if corrupt is not None:
            raise ValueError(
                "pass CounterfactualPairs alone, or clean and corrupt batches, not both"
            )
        clean, corrupt = clean.clean, clean.corrupt
    c = as_run(model, clean, who=who)
    if corrupt is None:
        return c, None
    k = as_run(model, corrupt, what="corrupt", who=who)
    if k.tokens.shape != c.tokens.shape:
        raise ValueError(
            f"clean and corrupt must have the same shape (positions line up), got {tuple(c.tokens.shape)} "
            f"and {tuple(k.tokens.shape)}"
        )
    return c, k


def pair_labels(clean: Run, corrupt: Run | None) -> tuple[Tensor, Tensor]:
    return clean.labels, (clean.labels if corrupt is None else corrupt.labels)

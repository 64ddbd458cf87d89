"""Evaluation mode for the length of a block: every probe, the trainer's evaluation and the views
use this one helper."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["eval_mode"]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every module of ``model`` in eval mode (no dropout) and, on exit, give each module back
    its own train/eval flag (so a model that was partly in eval mode stays so)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, mode in modes:
            m.training = mode

"""Training: the trainer (:mod:`~pe_interp.training.trainer`), its resumable state
(:mod:`~pe_interp.training.state`), callbacks and evaluation."""

from pe_interp.training.evaluation import evaluate
from pe_interp.training.trainer import Trainer

__all__ = ["Trainer", "evaluate"]

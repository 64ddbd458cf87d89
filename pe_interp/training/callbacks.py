"""Training callbacks: how probes watch a run while it trains.

A callback receives the :class:`~pe_interp.training.trainer.Trainer` itself, so it can read
``trainer.model``, ``trainer.task``, ``trainer.step``, ``trainer.run_dir`` (a ``Path`` or None) and
``trainer.train_cfg``. Callbacks must not change the model's parameters or consume the trainer's
random state: a run with callbacks reaches the same weights as one without.

Callbacks that write files into ``run_dir`` must survive ``--resume``: ``on_train_start`` is
called with ``trainer.step`` set to the resumed step, so the callback can drop any records it
wrote after that step before the crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pe_interp.config.model import TrainConfig


class Trainer(Protocol):
    """What a callback may read of the :class:`~pe_interp.training.trainer.Trainer` that calls it."""

    model: Any  # HookedPETransformer
    task: Any  # SyntheticTask
    train_cfg: TrainConfig
    run_dir: Path | None
    step: int


class Callback:
    """Base class; override what you need. All methods are no-ops by default."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first step (``trainer.step`` > 0 when resuming)."""

    def on_step(self, trainer: Trainer, step: int, loss: float) -> None:
        """After optimizer step ``step`` (1-based), with that batch's training loss."""

    def on_eval(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        """After each held-out evaluation (``metrics`` has ``test_acc``, ``test_loss``, ...)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step and the final checkpoint."""

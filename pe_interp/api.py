"""One call to train a run from a preset: ``pe_interp.train(task="distance", encoding="rope")``.

It sits in the application layer because it resolves a preset (:mod:`pe_interp.config.presets`); the
training layer itself (:class:`~pe_interp.training.trainer.Trainer`) takes explicit configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pe_interp.config.presets import build_run_configs, train_command
from pe_interp.training.callbacks import Callback
from pe_interp.training.trainer import Trainer, TrainResult

__all__ = ["train"]


def train(
    task: str = "distance",
    encoding: Any = "rope",
    preset: str = "quick",
    seed: int = 0,
    out: str | Path | None = None,
    resume: bool = False,
    callbacks: Sequence[Callback] = (),
    progress: bool = True,
    authors_quirks: bool = False,
    **overrides: Any,
) -> TrainResult:
    """Train one model: ``pe_interp.train(task="distance", encoding="rope", preset="quick")``.

    ``overrides`` are any ModelConfig, TrainConfig or task fields (``n_layers=4``, ``epochs=3``,
    ``max_between=30``...). With ``out``, the run directory is written as it goes and
    ``resume=True`` continues an interrupted run.
    """
    model_cfg, task_obj, train_cfg = build_run_configs(
        task, encoding, preset, seed, authors_quirks=authors_quirks, **overrides
    )
    trainer = Trainer(
        model_cfg,
        task_obj,
        train_cfg,
        run_dir=out,
        callbacks=callbacks,
        progress=progress,
        extra_config={
            "preset": preset,
            "authors_quirks": authors_quirks,
            "command": train_command(
                task, encoding, preset, seed, authors_quirks, out, **overrides
            ),
        },
    )
    return trainer.fit(resume=resume)

"""A user's own checkpoint is a run: a saved Hugging Face causal language model (``save_pretrained``
with its tokenizer) probed on one of our tasks in language-model form.

The form: the task's ids are the model's input ids (``0`` is the pad), and class ``c`` is the
answer token ``task.d_vocab + c`` (:func:`answer_ids`), read at the last real position. The model's
vocabulary must hold both, and its context the task's longest input; otherwise one line says
which is too small. :func:`load_model_dir` gives back a :class:`~pe_interp.checkpoint.Run` whose
model is a :class:`~pe_interp.bridge.BridgedModel` and whose splits are the preset's, so every
command that takes a run reads the directory (``pe-interp ablate DIR --task distance``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pe_interp.checkpoint import CheckpointError, Run

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def is_model_dir(path: str | Path) -> bool:
    """True when ``path`` holds a saved Hugging Face model (a ``config.json`` with a ``model_type``)."""
    config = Path(path) / "config.json"
    try:
        return config.is_file() and "model_type" in json.loads(config.read_text())
    except (OSError, ValueError, TypeError):
        return False


def answer_ids(task: Any) -> range:
    """The answer token of each class in language-model form: ``task.d_vocab + c``."""
    return range(task.d_vocab, task.d_vocab + task.n_classes)


def load_model_dir(path: str | Path, task: str | None, preset: str = "quick", seed: int = 0,
                   device: str = "cpu") -> Run:  # fmt: skip
    """The saved model at ``path`` as a run on ``task`` (the ``preset``'s task and splits, ``seed``)."""
    from pe_interp.bridge import BridgedModel
    from pe_interp.hf_arch import boot_bridge
    from pe_interp.presets import build_run_configs
    from pe_interp.tasks.batch import PAD_ID

    path = Path(path)
    if not is_model_dir(path):
        raise CheckpointError(f"{path}: not a saved Hugging Face model (no config.json with a model_type)")
    if task is None:
        raise CheckpointError(f"{path}: a saved Hugging Face model, not a pe-interp run: say which task to "
                              "probe it on with --task (and --preset for the task's size)")  # fmt: skip
    try:
        _, task_obj, train_cfg = build_run_configs(task=task, preset=preset, seed=seed)
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    weights = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{path}: no weights ({' or '.join(WEIGHT_FILES)})")
    bridge = boot_bridge(path, device=device)
    c = bridge.cfg
    need = task_obj.d_vocab + task_obj.n_classes
    if c.d_vocab < need:
        raise CheckpointError(f"{path}: the model's vocabulary ({c.d_vocab}) is too small for task {task!r} at preset "
                              f"{preset!r}: it needs {task_obj.d_vocab} input ids and {task_obj.n_classes} answer ids "
                              f"({need})")  # fmt: skip
    if c.n_ctx < task_obj.max_len:
        raise CheckpointError(f"{path}: the model's context ({c.n_ctx}) is shorter than task {task!r}'s longest "
                              f"input at preset {preset!r} ({task_obj.max_len})")  # fmt: skip
    model = BridgedModel(bridge, answers=answer_ids(task_obj), pad_id=PAD_ID)
    data = weights.read_bytes()
    provenance = {"sha256": hashlib.sha256(data).hexdigest(), "step": None}
    config = {"model_dir": {"model_type": model.cfg.model_type, "weights": weights.name},
              "task": task_obj.to_dict(), "preset": preset, "seed": seed}  # fmt: skip
    return Run(path, model.eval(), task_obj, train_cfg, config, provenance)


__all__ = ["answer_ids", "is_model_dir", "load_model_dir"]

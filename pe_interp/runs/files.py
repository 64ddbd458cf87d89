"""The files of a run directory, and reading and writing them safely.

Their names (``config.json``, ``model.safetensors``, ``train_state.safetensors``,
``metrics.jsonl``, ``steps/``) and ``config.json``'s keys; :class:`CheckpointError`, the one-line
error of a missing, corrupt or mismatched file; tensors saved atomically and loaded with every
failure named (:func:`load_tensors`, :func:`check_state_dict`), JSON and JSONL read the same way.
The run directory itself is described in :mod:`pe_interp.runs.checkpoint`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pe_interp.util import io

__all__ = [
    "CONFIG",
    "CONFIG_KEYS",
    "EVAL_SETS",
    "METRICS",
    "RUN_FILES",
    "STEPS_DIR",
    "TRAIN_STATE",
    "WEIGHTS",
    "CheckpointError",
    "atomic_save_tensors",
    "check_state_dict",
    "load_tensors",
    "read_json",
    "read_jsonl",
    "truncate_jsonl",
]


CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAIN_STATE = "train_state.safetensors"
METRICS = "metrics.jsonl"
STEPS_DIR = "steps"  # results of a snapshot's weights: steps/<S>/ablation.json, ...
EVAL_SETS = ("test", "all")
# The top-level keys of config.json: the three configs and the package version, then what
# ``pe_interp.train`` records (the preset, the authors' switch, and the command line that made the
# run, for ``pe-interp show``), and what the weights depend on besides them (``numerics``:
# :func:`pe_interp.util.hardware.numerics`). Any other key is a mistake and load_run says so.
CONFIG_KEYS = (
    "model",
    "task",
    "train",
    "version",
    "preset",
    "authors_quirks",
    "command",
    "numerics",
)
# The files that make a directory a run: training into a directory that holds any of them needs
# resume=True (--resume), and continues that run or is refused.
RUN_FILES = (CONFIG, WEIGHTS, TRAIN_STATE, METRICS)


class CheckpointError(ValueError):
    """A run-directory file is missing, corrupt, or does not match its config."""


def atomic_save_tensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with io.atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def read_json(path: Path) -> Any:
    """A JSON file of a run directory; a one-line CheckpointError if missing or invalid."""
    try:
        return io.read_json(path)
    except (FileNotFoundError, io.CorruptFileError) as err:
        raise CheckpointError(str(err)) from None


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a one-line CheckpointError if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        return load_file(str(path)), metadata
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({msg})") from None


def check_state_dict(
    path: Path, loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    """Raise a CheckpointError naming the first key or shape that does not match."""
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if missing:
        raise CheckpointError(
            f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing) for this config"
        )
    if unexpected:
        raise CheckpointError(
            f"{path}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} extra) for this config"
        )
    for key, ref in expected.items():
        if loaded[key].shape != ref.shape:
            raise CheckpointError(
                f"{path}: tensor {key!r} has shape {tuple(loaded[key].shape)}, config expects {tuple(ref.shape)}"
            )
        if loaded[key].dtype != ref.dtype:
            raise CheckpointError(
                f"{path}: tensor {key!r} is {str(loaded[key].dtype).removeprefix('torch.')}, "
                f"the model expects {str(ref.dtype).removeprefix('torch.')}"
            )
        if not torch.isfinite(loaded[key]).all() and loaded[key].is_floating_point():
            raise CheckpointError(f"{path}: tensor {key!r} contains non-finite values")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a run's JSONL file ([] when missing; a torn last line is skipped, see
    :func:`pe_interp.util.io.read_jsonl`); a CheckpointError for any other bad line."""
    try:
        return io.read_jsonl(path, missing_ok=True)
    except io.CorruptFileError as err:
        raise CheckpointError(str(err)) from None


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep only the records with ``step <= max_step`` (used when resuming)."""
    path = Path(path)
    if path.is_file():
        io.write_jsonl(path, [r for r in read_jsonl(path) if r.get("step", 0) <= max_step])

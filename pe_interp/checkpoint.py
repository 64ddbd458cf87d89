"""Run directories: safetensors + JSON, atomic writes, and one-line errors on anything wrong.

A run directory holds:

- ``config.json``: the model, task and training configs, the preset and the package version;
- ``model.safetensors``: the latest weights (what :func:`load_run` reads);
- ``train_state.safetensors``: weights, optimizer moments and RNG states, with the step and
  optimizer hyper-parameters as JSON metadata. It is the single source of truth for ``--resume``,
  so a crash between two writes can never pair weights and optimizer state from different steps;
- ``metrics.jsonl``: one JSON line per evaluation.

Every file is written to a temporary name and renamed into place, so a reader sees either the old
or the new file, never half of one. Nothing is ever unpickled.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pe_interp import io
from pe_interp.io import append_jsonl, atomic_write_bytes, atomic_write_json

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAIN_STATE = "train_state.safetensors"
METRICS = "metrics.jsonl"
EVAL_SETS = ("test", "all")
# The top-level keys of config.json: the three configs and the package version, then what
# ``pe_interp.train`` records (the preset, the authors' switch, and the command line that made the
# run, for ``pe-interp show``). Any other key is a mistake and load_run says so.
CONFIG_KEYS = ("model", "task", "train", "version", "preset", "authors_quirks", "command")

__all__ = [
    "CONFIG",
    "CONFIG_KEYS",
    "METRICS",
    "TRAIN_STATE",
    "WEIGHTS",
    "CheckpointError",
    "Run",
    "append_jsonl",
    "atomic_save_tensors",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_state_dict",
    "load_run",
    "load_tensors",
    "read_json",
    "read_jsonl",
    "truncate_jsonl",
]


class CheckpointError(ValueError):
    """A run-directory file is missing, corrupt, or does not match its config."""


def atomic_save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
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


def check_state_dict(path: Path, loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Raise a CheckpointError naming the first key or shape that does not match."""
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if missing:
        raise CheckpointError(f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing) for this config")
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} extra) for this config")
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
    :func:`pe_interp.io.read_jsonl`); a CheckpointError for any other bad line."""
    try:
        return io.read_jsonl(path, missing_ok=True)
    except io.CorruptFileError as err:
        raise CheckpointError(str(err)) from None


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep only the records with ``step <= max_step`` (used when resuming)."""
    path = Path(path)
    if path.is_file():
        io.write_jsonl(path, [r for r in read_jsonl(path) if r.get("step", 0) <= max_step])


@dataclass(frozen=True)
class Run:
    """A trained run, as :func:`load_run` gives it back. Unpacks as ``model, task = run``."""

    run_dir: Path
    model: Any  # HookedPETransformer
    task: Any
    train_cfg: Any  # TrainConfig
    config: dict[str, Any]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.task))

    def test_set(self, n: int | None = None):
        """The held-out split used during training (its first ``n`` examples)."""
        return self.examples("test", n)

    def examples(self, on: str = "test", n: int | None = None):
        """Evaluation examples: ``on="test"``, the held-out split used during training (the
        default for every probe); ``on="all"``, the training and held-out sets together (the
        authors' ablation protocol, digest §6). Rows of the class the run's loss ignores
        (``TrainConfig.ignore_index``) are left out, as in the authors' accuracy. ``n`` keeps
        the first ``n``."""
        if on not in EVAL_SETS:
            raise ValueError(f"on must be one of {', '.join(EVAL_SETS)}; got {on!r}")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n must be a positive integer or None, got {n!r}")
        train, test = _splits(self.task, self.train_cfg.n_train, self.train_cfg.n_test, self.train_cfg.seed)
        batch = test if on == "test" else type(test).cat([train, test])
        ignore = self.train_cfg.ignore_index
        if ignore is not None:
            batch = batch[batch.labels != ignore]
        return batch if n is None else batch[: min(n, len(batch))]

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir / METRICS)


@functools.lru_cache(maxsize=4)
def _splits(task: Any, n_train: int, n_test: int, seed: int):
    """A run's splits, generated once per process (tasks are frozen, hashable dataclasses)."""
    return task.splits(n_train, n_test, seed=seed)


def load_run(run_dir: str | Path, device: str = "cpu") -> Run:
    """Load a run directory written by :func:`pe_interp.train`: the model (eval mode) and task."""
    from pe_interp.config import ModelConfig, TrainConfig, check_device
    from pe_interp.model import HookedPETransformer
    from pe_interp.tasks import task_from_dict

    run_dir = Path(run_dir)
    check_device(device)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found" if not run_dir.exists()
                              else f"{run_dir}: not a run directory (a file)")
    if not (run_dir / CONFIG).exists():
        raise CheckpointError(f"{run_dir}: not a run directory (no {CONFIG}; `pe-interp train --out DIR` writes one)")
    config = read_json(run_dir / CONFIG)
    if not isinstance(config, dict):
        raise CheckpointError(f"{run_dir / CONFIG}: invalid config (a JSON object expected, got {type(config).__name__})")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise CheckpointError(f"{run_dir / CONFIG}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
                              f"allowed: {', '.join(CONFIG_KEYS)}")
    missing = [k for k in ("model", "task", "train") if k not in config]
    if missing:
        raise CheckpointError(f"{run_dir / CONFIG}: invalid config (no {', '.join(map(repr, missing))} section)")
    try:
        model_cfg = ModelConfig.from_dict(config["model"])
        task = task_from_dict(config["task"])
        train_cfg = TrainConfig.from_dict(config["train"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{run_dir / CONFIG}: invalid config ({err})") from None
    model = HookedPETransformer(model_cfg)
    state, _ = load_tensors(run_dir / WEIGHTS)
    check_state_dict(run_dir / WEIGHTS, state, model.state_dict())
    model.load_state_dict(state)
    model.to(device).eval()
    return Run(run_dir, model, task, train_cfg, config)

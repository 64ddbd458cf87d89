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
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAIN_STATE = "train_state.safetensors"
METRICS = "metrics.jsonl"
EVAL_SETS = ("test", "all")


class CheckpointError(ValueError):
    """A run-directory file is missing, corrupt, or does not match its config."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None


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


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            # A line cut short by a crash mid-write is the only way to get here; skip it only if
            # it is the last line.
            if i == len(path.read_text().splitlines()):
                break
            raise CheckpointError(f"{path}: invalid JSON on line {i}") from None
    return out


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep only the records with ``step <= max_step`` (used when resuming)."""
    path = Path(path)
    if path.is_file():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
        atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in kept).encode())


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
    from pe_interp.config import ModelConfig
    from pe_interp.model import HookedPETransformer
    from pe_interp.tasks import task_from_dict
    from pe_interp.training import TrainConfig

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    config = read_json(run_dir / CONFIG)
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

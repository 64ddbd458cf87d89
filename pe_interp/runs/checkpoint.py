"""Run directories: safetensors + JSON, atomic writes, and one-line errors on anything wrong.

A run directory holds:

- ``config.json``: the model, task and training configs, the preset and the package version;
- ``model.safetensors``: the latest weights (what :func:`load_run` reads);
- ``train_state.safetensors``: weights, optimizer moments and RNG states, with the step and
  optimizer hyper-parameters as JSON metadata. It is the single source of truth for ``--resume``,
  so a crash between two writes can never pair weights and optimizer state from different steps;
- ``metrics.jsonl``: one JSON line per evaluation;
- probe results (``ablation.json``, ``deposits.json``, ...), each recording the weights it was
  computed from (:func:`save_result`: the sha256 of ``model.safetensors`` and its step), which
  :func:`weights_status` compares with the run's weights now: a result of older weights is stale;
- ``.pe-interp.lock``: held while a process writes the directory (:func:`pe_interp.util.io.dir_lock`).

Every file is written to a temporary name and renamed into place, so a reader sees either the old
or the new file, never half of one. Nothing is ever unpickled.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load as load_bytes

from pe_interp.runs.files import (
    CONFIG,
    CONFIG_KEYS,
    EVAL_SETS,
    METRICS,
    RUN_FILES,
    STEPS_DIR,
    TRAIN_STATE,
    WEIGHTS,
    CheckpointError,
    atomic_save_tensors,
    check_state_dict,
    load_tensors,
    read_json,
    read_jsonl,
    truncate_jsonl,
)
from pe_interp.runs.provenance import (
    CURRENT,
    STALE,
    UNRECORDED,
    WEIGHTS_KEY,
    provenance_of,
    save_result,
    weights_provenance,
    weights_status,
)
from pe_interp.util.io import append_jsonl, atomic_write_bytes, atomic_write_json

__all__ = [
    "CONFIG",
    "CONFIG_KEYS",
    "CURRENT",
    "METRICS",
    "RUN_FILES",
    "STEPS_DIR",
    "STALE",
    "UNRECORDED",
    "WEIGHTS_KEY",
    "TRAIN_STATE",
    "WEIGHTS",
    "CheckpointError",
    "Run",
    "append_jsonl",
    "atomic_save_tensors",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_state_dict",
    "config_differences",
    "load_run",
    "load_tensors",
    "read_json",
    "read_jsonl",
    "save_result",
    "split_step",
    "truncate_jsonl",
    "weights_provenance",
    "weights_status",
]


@dataclass(frozen=True)
class Run:
    """A trained run, as :func:`load_run` gives it back. Unpacks as ``model, task = run``."""

    run_dir: Path
    model: Any  # HookedPETransformer
    task: Any
    train_cfg: Any  # TrainConfig
    config: dict[str, Any]
    # the weights loaded, {"sha256": ..., "step": ...}: what probe results record (save_result)
    provenance: dict[str, Any] | None = None
    # the snapshot loaded (load_run(..., step=S), RUN@S), None for the run's final weights
    at_step: int | None = None

    @property
    def result_dir(self) -> Path:
        """Where probes of these weights write: the run directory, or ``steps/<S>/`` in it for a
        snapshot, so that a result of a past step never overwrites or stands in for the final one."""
        return (
            self.run_dir if self.at_step is None else self.run_dir / STEPS_DIR / str(self.at_step)
        )

    @property
    def name(self) -> str:
        """``RUN`` or ``RUN@S``: how commands name these weights."""
        return str(self.run_dir) if self.at_step is None else f"{self.run_dir}@{self.at_step}"

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
        train, test = _splits(
            self.task, self.train_cfg.n_train, self.train_cfg.n_test, self.train_cfg.seed
        )
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


def split_step(run: str | Path) -> tuple[Path, int | None]:
    """``"RUN@S"`` -> ``(RUN, S)``; a path that exists as written, or has no ``@<int>`` tail, is
    ``(path, None)``."""
    text = str(run)
    head, sep, tail = text.rpartition("@")
    if not sep or Path(text).exists():
        return Path(text), None
    if not tail.isdigit():
        raise CheckpointError(
            f"{text}: a step after '@' must be a whole number (RUN@S, e.g. runs/r0@48), got {tail!r}"
        )
    return Path(head), int(tail)


def load_run(run_dir: str | Path, device: str = "cpu", step: int | None = None) -> Run:
    """Load a run directory written by :func:`pe_interp.train`: the model (eval mode) and task.
    ``step`` (or ``"RUN@S"``) loads the snapshot of that step (``TrainConfig.snapshots``)."""
    from pe_interp.config.model import ModelConfig, TrainConfig, check_device
    from pe_interp.runs.arch import build_model, probe_model
    from pe_interp.runs.snapshots import SnapshotError, load_snapshot, snapshot_path
    from pe_interp.tasks import task_from_dict

    run_dir, at = split_step(run_dir)
    if step is not None and at is not None and step != at:
        raise CheckpointError(f"{run_dir}@{at}: asked for step {step} too; give the step once")
    step = at if step is None else step
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise CheckpointError(f"step must be a whole number >= 0, got {step!r}")
    check_device(device)
    if not run_dir.is_dir():
        raise CheckpointError(
            f"{run_dir}: run directory not found"
            if not run_dir.exists()
            else f"{run_dir}: not a run directory (a file)"
        )
    if not (run_dir / CONFIG).exists():
        raise CheckpointError(
            f"{run_dir}: not a run directory (no {CONFIG}; `pe-interp train --out DIR` writes one)"
        )
    config = read_json(run_dir / CONFIG)
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{run_dir / CONFIG}: invalid config (a JSON object expected, got {type(config).__name__})"
        )
    if "model_type" in config:
        raise CheckpointError(
            f"{run_dir}: a saved Hugging Face model, not a pe-interp run: give the task to probe it on "
            "(pe-interp ablate DIR --task distance; pe_interp.runs.model_dirs.load_model_dir)"
        )
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise CheckpointError(
            f"{run_dir / CONFIG}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(CONFIG_KEYS)}"
        )
    missing = [k for k in ("model", "task", "train") if k not in config]
    if missing:
        raise CheckpointError(
            f"{run_dir / CONFIG}: invalid config (no {', '.join(map(repr, missing))} section)"
        )
    try:
        model_cfg = ModelConfig.from_dict(config["model"])
        task = task_from_dict(config["task"])
        train_cfg = TrainConfig.from_dict(config["train"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{run_dir / CONFIG}: invalid config ({err})") from None
    model = build_model(model_cfg)
    path = run_dir / WEIGHTS
    if step is not None:
        path = snapshot_path(run_dir, step)
        try:
            data, provenance = load_snapshot(run_dir, step)
        except SnapshotError as err:
            raise CheckpointError(str(err)) from None
    elif not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    else:
        data = path.read_bytes()  # hashed and loaded from the same bytes: the provenance is exact
        provenance = provenance_of(path, data)
    try:
        state = load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({msg})") from None
    check_state_dict(path, state, model.state_dict())
    model.load_state_dict(state)
    model = probe_model(model.to(device).eval(), run_dir, device)
    return Run(run_dir, model, task, train_cfg, config, provenance, step)


def config_differences(
    saved: dict[str, Any], mine: dict[str, Any], parts=("model", "task", "train")
) -> list[str]:
    """``part.field: saved -> mine`` for every field of the config parts that differs, the
    task's name and the encoding first and the model fields that follow the task last."""
    missing = object()
    out: list[tuple[int, str]] = []
    for part in parts:
        a, b = saved.get(part) or {}, mine.get(part) or {}
        if not isinstance(a, dict) or not isinstance(b, dict):
            if a != b:
                out.append((1, f"{part}: {json.dumps(a)[:40]} -> {json.dumps(b)[:40]}"))
            continue
        for key in sorted(set(a) | set(b)):
            x, y = a.get(key, missing), b.get(key, missing)
            if x != y:
                show = lambda v: "(absent)" if v is missing else json.dumps(v)[:40]  # noqa: E731
                rank = (
                    0
                    if key in ("name", "encoding")
                    else 2
                    if part == "model" and key in _DERIVED
                    else 1
                )
                out.append((rank, f"{part}.{key}: {show(x)} -> {show(y)}"))
    return [text for _, text in sorted(out, key=lambda r: r[0])]


_DERIVED = ("n_ctx", "n_classes", "d_vocab")  # model fields that follow the task

"""Training snapshots: a run's weights at chosen steps, so that any probe can look at any step.

``TrainConfig(snapshots="log")`` keeps the weights at step 0, at the powers of two below
``snapshot_every`` (1, 2, 4, ...), at every multiple of ``snapshot_every`` (default: each epoch)
and at the last step, as Pythia keeps its checkpoints: dense where the model changes fastest.

A run directory then holds ``snapshots/step-0000048.safetensors`` (the weights, with their step as
metadata, the same bytes as a ``model.safetensors`` of that step) and ``snapshots/manifest.json``,
one entry per snapshot with its file, sha256 and size. Each file is written atomically before its
manifest entry, and both before the training checkpoint of that step, so a crash never tears a
snapshot or lists a missing one; a resumed run drops the entries after its checkpoint and writes
them again as it replays those steps (bit for bit the same weights, see :mod:`pe_interp.training.trainer`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_bytes

from pe_interp.util.io import CorruptFileError, atomic_write_bytes, atomic_write_json, read_json

SNAPSHOT_DIR = "snapshots"
MANIFEST = "manifest.json"
SNAPSHOT_MODES = ("none", "log")
FORMAT = 1

__all__ = [
    "MANIFEST",
    "SNAPSHOT_DIR",
    "SNAPSHOT_MODES",
    "SnapshotError",
    "SnapshotWriter",
    "load_snapshot",
    "read_manifest",
    "snapshot_path",
    "snapshot_schedule",
    "snapshot_steps",
    "weights_bytes",
]


class SnapshotError(ValueError):
    """A snapshot or its manifest is missing, corrupt or asked for at a step the run did not keep."""


def snapshot_schedule(total_steps: int, every: int, mode: str = "log") -> list[int]:
    """The steps a run of ``total_steps`` keeps: 0, the powers of two below ``every``, every
    multiple of ``every``, and ``total_steps`` ([] for ``mode="none"``)."""
    if mode == "none":
        return []
    if mode not in SNAPSHOT_MODES:
        raise ValueError(
            f"snapshots must be one of {', '.join(map(repr, SNAPSHOT_MODES))}; got {mode!r}"
        )
    if every < 1:
        raise ValueError(f"snapshot_every must be >= 1, got {every}")
    steps = {0, total_steps} | set(range(every, total_steps + 1, every))
    power = 1
    while power < min(every, total_steps):
        steps.add(power)
        power *= 2
    return sorted(steps)


def weights_bytes(state: dict[str, torch.Tensor], step: int) -> bytes:
    """The safetensors bytes of a state dict at ``step`` (the format of ``model.safetensors``)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    return save_bytes(tensors, metadata={"step": str(step)})


def snapshot_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"step-{step:07d}.safetensors"


def read_manifest(run_dir: str | Path) -> list[dict[str, Any]]:
    """The manifest's entries, by step ([] when the run keeps no snapshots)."""
    path = Path(run_dir) / SNAPSHOT_DIR / MANIFEST
    if not path.is_file():
        return []
    try:
        data = read_json(path)
    except (CorruptFileError, FileNotFoundError) as err:
        raise SnapshotError(str(err)) from None
    entries = data.get("snapshots") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("step"), int) and isinstance(e.get("sha256"), str)
        for e in entries
    ):
        raise SnapshotError(
            f"{path}: not a snapshot manifest (a 'snapshots' list of {{step, file, sha256}} expected)"
        )
    return sorted(entries, key=lambda e: e["step"])


def snapshot_steps(run_dir: str | Path) -> list[int]:
    """The steps at which ``run_dir`` kept its weights (``pe_interp.snapshot_steps``)."""
    return [e["step"] for e in read_manifest(run_dir)]


def load_snapshot(run_dir: str | Path, step: int) -> tuple[bytes, dict[str, Any]]:
    """The bytes of the snapshot at ``step``, checked against the manifest's sha256, and its
    provenance ``{"sha256", "step"}``; a one-line SnapshotError naming the steps kept otherwise."""
    entries = {e["step"]: e for e in read_manifest(run_dir)}
    if step not in entries:
        kept = sorted(entries)
        shown = ", ".join(map(str, kept[:12])) + (f", ... {kept[-1]}" if len(kept) > 12 else "")
        raise SnapshotError(
            f"{run_dir}: no snapshot at step {step}; "
            + (
                f"the run kept steps {shown}"
                if kept
                else "the run kept none (train it with --snapshots log)"
            )
        )
    path = (
        Path(run_dir)
        / SNAPSHOT_DIR
        / str(entries[step].get("file", snapshot_path(run_dir, step).name))
    )
    if not path.is_file():
        raise SnapshotError(
            f"{path}: the snapshot of step {step} is listed in the manifest but missing"
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entries[step]["sha256"]:
        raise SnapshotError(
            f"{path}: sha256 {digest[:12]} differs from the manifest's {entries[step]['sha256'][:12]}: "
            "the file is damaged"
        )
    return data, {"sha256": digest, "step": step}


class SnapshotWriter:
    """Writes a training run's snapshots at the steps of its schedule (see the module's doc)."""

    def __init__(self, run_dir: str | Path, steps: list[int]):
        self.run_dir, self.steps = Path(run_dir), set(steps)
        self.entries: list[dict[str, Any]] = []

    def start(self, step: int, model: torch.nn.Module) -> None:
        """At the start of training (``step`` > 0 when resuming): forget entries after ``step``,
        and keep the weights of ``step`` when it is scheduled and not kept yet (step 0)."""
        self.entries = [e for e in read_manifest(self.run_dir) if e["step"] <= step]
        self._write_manifest()
        if step in self.steps and all(e["step"] != step for e in self.entries):
            self.save(step, model)

    def maybe_save(self, step: int, model: torch.nn.Module, last: bool = False) -> None:
        """Keep the weights after ``step`` when it is scheduled (or ``last``: the run ends there)."""
        if step in self.steps or last:
            self.save(step, model)

    def save(self, step: int, model: torch.nn.Module) -> None:
        data = weights_bytes(model.state_dict(), step)
        path = snapshot_path(self.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
        entry = {
            "step": step,
            "file": path.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
        self.entries = [e for e in self.entries if e["step"] != step] + [entry]
        self._write_manifest()

    def _write_manifest(self) -> None:
        path = self.run_dir / SNAPSHOT_DIR / MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            path,
            {"format": FORMAT, "snapshots": sorted(self.entries, key=lambda e: e["step"])},
            indent=1,
        )

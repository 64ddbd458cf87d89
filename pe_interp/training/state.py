"""The trainer's run directory: its config record, checkpoints saved and loaded, resume refused.

:class:`RunDirectory` is the part of :class:`pe_interp.training.trainer.Trainer` that reads and writes
``run_dir``: ``config.json`` (and the refusal to continue a run with other settings), the training
state and weights saved at each checkpoint (model, optimizer moments, RNG states, the pinned
attention routes) and loaded on resume with every tensor checked, and the decision to start,
continue or refuse a directory. It works on the trainer's attributes (``run_dir``, ``model``,
``optimizer``, ``step``, ``running``, ``stopped`` and the configs).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from pe_interp._version import __version__
from pe_interp.config.model import ModelConfig, TrainConfig
from pe_interp.models.hooked import attn_routes
from pe_interp.runs.checkpoint import (
    CONFIG,
    METRICS,
    RUN_FILES,
    TRAIN_STATE,
    WEIGHTS,
    CheckpointError,
    atomic_save_tensors,
    atomic_write_json,
    check_state_dict,
    config_differences,
    load_tensors,
    read_json,
    truncate_jsonl,
    weights_provenance,
)
from pe_interp.tasks import task_from_dict
from pe_interp.util import hardware


def _check_optimizer_state(
    path: Path,
    state: dict[int, dict[str, torch.Tensor]],
    params: dict[str, torch.Tensor],
    step: int,
) -> None:
    """A CheckpointError naming the first optimizer tensor that is missing or misshapen: the
    optimizer would load the rest and fail at its next step (or restart its moments silently)."""
    names = list(params)
    damaged = "the file is damaged: restore it from a copy, or train again into a new --out"
    if step > 0 and not state:
        raise CheckpointError(
            f"{path}: no optimizer tensors (optim.*) although the run is at step {step}; {damaged}"
        )
    keys = sorted({k for entry in state.values() for k in entry})
    for idx in sorted(state):
        if not 0 <= idx < len(names):
            raise CheckpointError(
                f"{path}: optimizer tensors for parameter {idx}, but the model has {len(names)}; {damaged}"
            )
        missing = [k for k in keys if k not in state[idx]]
        if missing:
            raise CheckpointError(
                f"{path}: optimizer tensor 'optim.{idx}.{missing[0]}' (of {names[idx]}) is missing; {damaged}"
            )
        shape = tuple(params[names[idx]].shape)
        for k, v in state[idx].items():
            if v.ndim > 0 and tuple(v.shape) != shape:
                raise CheckpointError(
                    f"{path}: optimizer tensor 'optim.{idx}.{k}' has shape {tuple(v.shape)}, its "
                    f"parameter {names[idx]} {shape}; {damaged}"
                )


class RunDirectory:
    """Saving, loading and opening the run directory of a :class:`~pe_interp.training.trainer.Trainer`."""

    def config_record(self) -> dict[str, Any]:
        return {
            "model": self.model_cfg.to_dict(),
            "task": self.task.to_dict(),
            "train": self.train_cfg.to_dict(),
            "version": __version__,
            # what the weights depend on besides the configs: dtype, threads, torch, CPU
            "numerics": hardware.numerics(self.device, self.train_cfg.amp, attn_routes.policy()),
            **self.extra_config,
        }

    def save_checkpoint(self) -> None:
        if self.run_dir is None:
            return
        weights = self.model.state_dict()
        tensors = {f"model.{k}": v for k, v in weights.items()}
        opt = self.optimizer.state_dict()
        for idx, state in opt["state"].items():
            for key, value in state.items():
                tensors[f"optim.{idx}.{key}"] = torch.as_tensor(value)
        tensors["rng.cpu"] = torch.get_rng_state()
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                tensors[f"rng.cuda.{i}"] = s
        meta = {
            "step": str(self.step),
            "param_groups": json.dumps(opt["param_groups"]),
            "running": json.dumps(self.running),
            "stopped": str(int(self.stopped)),
            # bf16 attention routes chosen by measurement (pe_interp.models.hooked.attn_routes): pinned on
            # resume, so that a resumed run computes exactly what an uninterrupted one did
            "attn_routes": json.dumps(attn_routes.chosen()),
        }
        atomic_save_tensors(self.run_dir / TRAIN_STATE, tensors, meta)
        atomic_save_tensors(self.run_dir / WEIGHTS, weights, {"step": str(self.step)})

    def check_same_config(self) -> None:
        """Refuse to continue a run whose config.json differs from this run's, naming the fields."""
        assert self.run_dir is not None
        saved = _normalised(read_json(self.run_dir / CONFIG), self.run_dir / CONFIG)
        mine = _normalised(json.loads(json.dumps(self.config_record())), self.run_dir / CONFIG)
        # numerics are recorded, not compared: see _resumed_numerics
        saved.pop("numerics", None)
        mine.pop("numerics", None)
        diff = config_differences(saved, mine)
        if diff:
            shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
            raise CheckpointError(
                f"{self.run_dir}: resume with other settings than the run's (saved -> now: {shown}); "
                "resume with the run's settings (pe-interp show prints them) or use a new --out"
            )

    def load_checkpoint(self) -> None:
        assert self.run_dir is not None
        path = self.run_dir / TRAIN_STATE
        tensors, meta = load_tensors(path)
        try:
            step = int(meta["step"])
            groups = json.loads(meta["param_groups"])
        except (KeyError, ValueError):
            raise CheckpointError(
                f"{path}: missing or invalid step/param_groups metadata"
            ) from None
        weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        check_state_dict(path, weights, self.model.state_dict())
        self.model.load_state_dict(weights)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optim."):
                _, idx, name = key.split(".", 2)
                state.setdefault(int(idx), {})[name] = value
        _check_optimizer_state(path, state, dict(self.model.named_parameters()), step)
        try:
            self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError) as err:
            raise CheckpointError(
                f"{path}: optimizer state does not fit this model ({err})"
            ) from None
        torch.set_rng_state(tensors["rng.cpu"])
        if torch.cuda.is_available():
            cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
            if cuda:
                torch.cuda.set_rng_state_all(cuda)
        self.step = step
        self.stopped = meta.get("stopped") == "1"
        if "attn_routes" in meta:
            attn_routes.pin(json.loads(meta["attn_routes"]))
        if "running" in meta:
            self.running = json.loads(meta["running"])

    def _open_run_dir(self, resume: bool) -> None:
        """Start, continue or refuse (under the run directory's lock); then write config.json."""
        assert self.run_dir is not None
        if (self.run_dir / "grid.json").exists():
            raise CheckpointError(
                f"{self.run_dir}: a sweep directory (grid.json), not a run directory; choose another one"
            )
        held = [name for name in RUN_FILES if (self.run_dir / name).exists()]
        if not resume and held:
            raise CheckpointError(
                f"{self.run_dir}: already holds a run ({', '.join(held)}); pass resume=True "
                "(--resume) to continue it with the same settings, or choose a new directory"
            )
        if resume:
            self.check_same_config()
        if resume and (self.run_dir / TRAIN_STATE).exists():
            self.load_checkpoint()
            truncate_jsonl(self.run_dir / METRICS, self.step)
        elif (
            resume and (self.run_dir / WEIGHTS).exists()
        ):  # finished or checkpointed, its state lost
            step = weights_provenance(self.run_dir)["step"]
            raise CheckpointError(
                f"{self.run_dir}: {TRAIN_STATE} is missing, so the run cannot be continued, and starting again "
                f"would replace its {WEIGHTS} (step {step}); restore {TRAIN_STATE} or choose a new directory"
            )
        else:
            torch.manual_seed(self.train_cfg.seed)  # dropout stream of a fresh run
            attn_routes.reset()  # its bf16 attention routes owe nothing to earlier runs
            if resume:  # started, but killed before its first checkpoint: start again
                truncate_jsonl(self.run_dir / METRICS, 0)
        record = self.config_record()
        if resume and (self.run_dir / TRAIN_STATE).exists():
            before = read_json(self.run_dir / CONFIG).get("numerics")
            record["numerics"] = _resumed_numerics(self.run_dir, before, record["numerics"])
        atomic_write_json(self.run_dir / CONFIG, record)


def _resumed_numerics(
    run_dir: Path, before: dict[str, Any] | None, now: dict[str, Any]
) -> dict[str, Any]:
    """The numerics of a resumed run: the run's own, and under ``resumed`` what each resume
    changed (with a warning: from there on the weights are not an uninterrupted run's)."""
    if not isinstance(before, dict):  # a run written before numerics were recorded
        return now
    changed = {k: v for k, v in now.items() if k != "resumed" and before.get(k) != v}
    if not changed:
        return before
    shown = ", ".join(f"{k} {before.get(k)!r} -> {v!r}" for k, v in changed.items())
    warnings.warn(
        f"{run_dir}: resumed with other numerics ({shown}); from here on the weights differ from "
        "an uninterrupted run's (config.json records it under numerics.resumed)",
        RuntimeWarning,
        stacklevel=4,
    )
    return {**before, "resumed": [*before.get("resumed", []), changed]}


def _normalised(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config record with every part passed through its dataclass, so that fields added
    after a run was written compare equal at their defaults."""
    out = dict(record)
    try:
        if "model" in out:
            out["model"] = ModelConfig.from_dict(out["model"]).to_dict()
        if "train" in out:
            out["train"] = TrainConfig.from_dict(out["train"]).to_dict()
        if "task" in out:
            out["task"] = task_from_dict(out["task"]).to_dict()
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{path}: invalid config ({err})") from None
    return json.loads(json.dumps(out))


__all__ = ["RunDirectory"]

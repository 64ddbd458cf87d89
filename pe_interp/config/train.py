"""Training configuration: a frozen dataclass that validates itself when it is built.

:class:`TrainConfig` holds the optimiser, schedule, data sizes, evaluation, checkpoint and snapshot
settings of one run (the model's are :class:`pe_interp.config.model.ModelConfig`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pe_interp.config.checks import DEVICE_FORMS, check_mapping, device_syntax_ok
from pe_interp.util.checks import check_bool, check_choice, check_float, check_int, check_seed

__all__ = ["LR_SCHEDULES", "TrainConfig"]


LR_SCHEDULES = ("warmup_cosine", "authors")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and data settings of one run (validated at construction).

    ``lr_schedule``: ``"warmup_cosine"`` warms up linearly to ``lr`` over
    ``round(warmup_frac * total_steps)`` steps, the first step already at ``lr / warm``, then
    decays by a cosine to ``min_lr_frac * lr``. ``"authors"`` is the authors' ``LambdaLR``:
    ``int(warmup_frac * total_steps)`` warm-up steps starting from 0 at the first step, then a
    cosine to 0. Both are stepped per batch.

    ``ignore_index``: a class index that neither the loss nor accuracy counts (the authors
    ignore count 0 on task 2 with ``CrossEntropyLoss(ignore_index=0)``); None counts every class.

    ``stop_at_acc``: stop at the first evaluation whose held-out accuracy reaches it ("train
    until it learns the task"); ``total_steps`` is then the cap, and the schedule is still
    laid out over the cap. 0 trains to the end.
    """

    n_train: int = 20_000
    n_test: int = 2_000
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_frac: float = 0.06
    min_lr_frac: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 0  # steps between evaluations; 0 = once per epoch
    checkpoint_every: int = 0  # steps between checkpoints; 0 = once per epoch
    eval_batch_size: int = 1024
    seed: int = 0
    device: str = "cpu"
    amp: bool = True  # bf16 autocast where the device runs bf16 natively (pe_interp.util.hardware)
    ignore_index: int | None = None  # a class left out of the loss and of accuracy
    lr_schedule: str = "warmup_cosine"
    stop_at_acc: float = 0.0  # stop once held-out accuracy reaches this; 0 = train to the end
    snapshots: str = (
        "none"  # "log": keep the weights at 0, 1, 2, 4, ..., every snapshot_every steps and the end
    )
    snapshot_every: int = 0  # steps between snapshots after the powers of two; 0 = once per epoch

    def __post_init__(self) -> None:
        own = "TrainConfig"
        for name in ("n_train", "n_test", "epochs", "batch_size", "eval_batch_size"):
            check_int(own, name, getattr(self, name))
        for name in ("eval_every", "checkpoint_every", "snapshot_every"):
            check_int(own, name, getattr(self, name), low=0)
        check_seed(own, "seed", self.seed)
        check_float(own, "lr", self.lr, 1e-9, 10.0)
        check_float(own, "weight_decay", self.weight_decay, 0.0, 10.0)
        check_float(own, "warmup_frac", self.warmup_frac, 0.0, 1.0)
        check_float(own, "min_lr_frac", self.min_lr_frac, 0.0, 1.0)
        check_float(own, "grad_clip", self.grad_clip, 0.0, 1e6)
        check_float(own, "stop_at_acc", self.stop_at_acc, 0.0, 1.0)
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas):
            raise ValueError(f"{own}.betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if not device_syntax_ok(self.device):
            raise ValueError(f"{own}.device must be {DEVICE_FORMS}, got {self.device!r}")
        check_bool(own, "amp", self.amp)
        if self.ignore_index is not None:
            check_int(own, "ignore_index", self.ignore_index, low=0)
        check_choice(own, "lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_choice(own, "snapshots", self.snapshots, ("none", "log"))

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.n_train / self.batch_size)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def snapshot_interval(self) -> int:
        return self.snapshot_every or self.steps_per_epoch

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then cosine."""
        if self.lr_schedule == "authors":
            warm = int(self.warmup_frac * self.total_steps)
            if step < warm:
                return self.lr * step / warm
            progress = (step - warm) / max(1, self.total_steps - warm)
            return self.lr * 0.5 * (1 + math.cos(math.pi * progress))
        warm = max(1, round(self.warmup_frac * self.total_steps)) if self.warmup_frac > 0 else 0
        if step < warm:
            return self.lr * (step + 1) / warm
        progress = (step - warm) / max(1, self.total_steps - warm)
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_frac + (1 - self.min_lr_frac) * cos)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        check_mapping("TrainConfig", data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

"""Training: AdamW, warm-up + cosine, clipping, held-out evaluation, crash-safe resume.

Determinism: the data are a pure function of ``(task, n_train, n_test, seed)``; the order of
epoch e is a permutation seeded by ``(seed, e)``; dropout draws from torch's global RNG, whose
state is saved with every checkpoint. A resumed run therefore replays exactly the steps an
uninterrupted run would take, and on CPU reaches the same weights bit for bit (tested by killing
a training process).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pe_interp.callbacks import Callback
from pe_interp.checkpoint import (
    CONFIG,
    METRICS,
    TRAIN_STATE,
    WEIGHTS,
    CheckpointError,
    append_jsonl,
    atomic_save_tensors,
    atomic_write_json,
    check_state_dict,
    load_tensors,
    read_json,
    truncate_jsonl,
)
from pe_interp.config import ModelConfig, check_choice, check_float, check_int


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is left in place."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and data settings of one run (validated at construction)."""

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
    amp: bool = True  # bfloat16 autocast on CUDA (ignored on CPU)

    def __post_init__(self) -> None:
        own = "TrainConfig"
        for name in ("n_train", "n_test", "epochs", "batch_size", "eval_batch_size"):
            check_int(own, name, getattr(self, name))
        for name in ("eval_every", "checkpoint_every", "seed"):
            check_int(own, name, getattr(self, name), low=0)
        check_float(own, "lr", self.lr, 1e-9, 10.0)
        check_float(own, "weight_decay", self.weight_decay, 0.0, 10.0)
        check_float(own, "warmup_frac", self.warmup_frac, 0.0, 1.0)
        check_float(own, "min_lr_frac", self.min_lr_frac, 0.0, 1.0)
        check_float(own, "grad_clip", self.grad_clip, 0.0, 1e6)
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas):
            raise ValueError(f"{own}.betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if not isinstance(self.device, str) or self.device.split(":")[0] not in ("cpu", "cuda", "mps"):
            raise ValueError(f"{own}.device must be 'cpu', 'cuda[:N]' or 'mps', got {self.device!r}")
        check_choice(own, "amp", self.amp, (True, False))

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.n_train / self.batch_size)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then cosine."""
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
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


@dataclass
class TrainResult:
    final: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None


@torch.no_grad()
def evaluate(model, batch, batch_size: int = 1024, amp: bool = False) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on a task batch (eval mode, restored after)."""
    was_training = model.training
    model.eval()
    device = model.W_E.device
    correct, loss_sum = 0, 0.0
    for i in range(0, len(batch), batch_size):
        part = batch[i : i + batch_size].to(device)
        with _autocast(device, amp):
            logits = model(part.tokens, part.pad_mask).float()
        loss_sum += F.cross_entropy(logits, part.labels, reduction="sum").item()
        correct += (logits.argmax(-1) == part.labels).sum().item()
    model.train(was_training)
    return {"acc": correct / len(batch), "loss": loss_sum / len(batch)}


def _autocast(device: torch.device, amp: bool):
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


class Trainer:
    """Trains one model on one task, writing a run directory when ``run_dir`` is given."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        task: Any,
        train_cfg: TrainConfig,
        run_dir: str | Path | None = None,
        callbacks: Sequence[Callback] = (),
        progress: bool = True,
        extra_config: dict[str, Any] | None = None,
    ):
        from pe_interp.model import HookedPETransformer

        self.model_cfg, self.task, self.train_cfg = model_cfg, task, train_cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.callbacks = list(callbacks)
        self.progress = progress
        self.extra_config = extra_config or {}
        self.device = torch.device(train_cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("TrainConfig.device is 'cuda' but CUDA is not available")
        self.model = HookedPETransformer(model_cfg).to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=train_cfg.lr, betas=train_cfg.betas, weight_decay=train_cfg.weight_decay
        )
        self.step = 0
        self.train, self.test = task.splits(train_cfg.n_train, train_cfg.n_test, seed=train_cfg.seed)

    # ---- run directory -----------------------------------------------------------------------
    def config_record(self) -> dict[str, Any]:
        from pe_interp import __version__

        return {
            "model": self.model_cfg.to_dict(),
            "task": self.task.to_dict(),
            "train": self.train_cfg.to_dict(),
            "version": __version__,
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
        meta = {"step": str(self.step), "param_groups": json.dumps(opt["param_groups"])}
        atomic_save_tensors(self.run_dir / TRAIN_STATE, tensors, meta)
        atomic_save_tensors(self.run_dir / WEIGHTS, weights, {"step": str(self.step)})

    def load_checkpoint(self) -> None:
        assert self.run_dir is not None
        saved = read_json(self.run_dir / CONFIG)
        mine = json.loads(json.dumps(self.config_record()))
        for part in ("model", "task", "train"):
            if saved.get(part) != mine[part]:
                raise CheckpointError(
                    f"{self.run_dir / CONFIG}: the {part} config differs from this run's; "
                    "resume with the same settings or use a new --out"
                )
        path = self.run_dir / TRAIN_STATE
        tensors, meta = load_tensors(path)
        try:
            step = int(meta["step"])
            groups = json.loads(meta["param_groups"])
        except (KeyError, ValueError):
            raise CheckpointError(f"{path}: missing or invalid step/param_groups metadata") from None
        weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        check_state_dict(path, weights, self.model.state_dict())
        self.model.load_state_dict(weights)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optim."):
                _, idx, name = key.split(".", 2)
                state.setdefault(int(idx), {})[name] = value
        try:
            self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError) as err:
            raise CheckpointError(f"{path}: optimizer state does not fit this model ({err})") from None
        torch.set_rng_state(tensors["rng.cpu"])
        if torch.cuda.is_available():
            cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
            if cuda:
                torch.cuda.set_rng_state_all(cuda)
        self.step = step

    # ---- training ----------------------------------------------------------------------------
    def epoch_order(self, epoch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.train_cfg.seed * 1_000_003 + epoch)
        return torch.randperm(self.train_cfg.n_train, generator=gen)

    def fit(self, resume: bool = False) -> TrainResult:
        cfg = self.train_cfg
        if self.run_dir is not None:
            has_state = (self.run_dir / TRAIN_STATE).exists()
            if resume and has_state:
                self.load_checkpoint()
                truncate_jsonl(self.run_dir / METRICS, self.step)
            elif has_state or (self.run_dir / METRICS).exists():
                if not resume:
                    raise CheckpointError(
                        f"{self.run_dir}: already holds a run; pass resume=True (--resume) or choose a new directory"
                    )
            else:
                torch.manual_seed(cfg.seed)  # dropout stream of a fresh run
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.run_dir / CONFIG, self.config_record())
        else:
            torch.manual_seed(cfg.seed)

        history: list[dict[str, Any]] = []
        for cb in self.callbacks:
            cb.on_train_start(self)
        total = cfg.total_steps
        eval_every = cfg.eval_every or cfg.steps_per_epoch
        ckpt_every = cfg.checkpoint_every or cfg.steps_per_epoch
        bar = _progress(total, self.step, self.progress)
        model, opt = self.model, self.optimizer
        model.train()
        last_good = self.step
        run_loss, run_correct, run_seen = 0.0, 0, 0
        t0 = time.time()
        try:
            while self.step < total:
                epoch, offset = divmod(self.step, cfg.steps_per_epoch)
                order = self.epoch_order(epoch)
                idx = order[offset * cfg.batch_size : (offset + 1) * cfg.batch_size]
                part = self.train[idx].to(self.device)
                for group in opt.param_groups:
                    group["lr"] = cfg.lr_at(self.step)
                with _autocast(self.device, cfg.amp):
                    logits = model(part.tokens, part.pad_mask)
                loss = F.cross_entropy(logits.float(), part.labels)
                if not torch.isfinite(loss):
                    where = f"; the last good checkpoint (step {last_good}) is in {self.run_dir}" if self.run_dir else ""
                    raise NonFiniteLossError(f"non-finite loss ({loss.item()}) at step {self.step + 1}{where}")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                self.step += 1
                loss_value = loss.item()
                run_loss += loss_value * len(idx)
                run_correct += (logits.argmax(-1) == part.labels).sum().item()
                run_seen += len(idx)
                for cb in self.callbacks:
                    cb.on_step(self, self.step, loss_value)
                if bar is not None:
                    bar.update(1)
                if self.step % eval_every == 0 or self.step == total:
                    test = evaluate(model, self.test, cfg.eval_batch_size, cfg.amp)
                    record = {
                        "step": self.step,
                        "epoch": self.step / cfg.steps_per_epoch,
                        "lr": cfg.lr_at(self.step - 1),
                        "train_loss": run_loss / max(run_seen, 1),
                        "train_acc": run_correct / max(run_seen, 1),
                        "test_loss": test["loss"],
                        "test_acc": test["acc"],
                        "seconds": round(time.time() - t0, 3),
                    }
                    run_loss, run_correct, run_seen = 0.0, 0, 0
                    history.append(record)
                    if self.run_dir is not None:
                        append_jsonl(self.run_dir / METRICS, record)
                    for cb in self.callbacks:
                        cb.on_eval(self, self.step, record)
                    if bar is not None:
                        bar.set_postfix(loss=f"{record['train_loss']:.3f}", test_acc=f"{record['test_acc']:.3f}")
                if self.step % ckpt_every == 0 or self.step == total:
                    self.save_checkpoint()
                    last_good = self.step
        finally:
            if bar is not None:
                bar.close()
        for cb in self.callbacks:
            cb.on_train_end(self)
        final = history[-1] if history else {"step": self.step, **_prefixed(evaluate(model, self.test, cfg.eval_batch_size, cfg.amp))}
        return TrainResult(final=final, history=history, run_dir=self.run_dir)


def _prefixed(metrics: dict[str, float]) -> dict[str, float]:
    return {f"test_{k}": v for k, v in metrics.items()}


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, leave=False)


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
    from pe_interp.presets import build_run_configs

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
        extra_config={"preset": preset, "authors_quirks": authors_quirks},
    )
    result = trainer.fit(resume=resume)
    result.model = trainer.model  # type: ignore[attr-defined]
    return result

"""Training: AdamW, warm-up + cosine, clipping, held-out evaluation, crash-safe resume.

Determinism: the data are a pure function of ``(task, n_train, n_test, seed)``; the order of
epoch e is a permutation seeded by ``(seed, e)``; dropout draws from torch's global RNG, whose
state is saved with every checkpoint. A resumed run therefore replays exactly the steps an
uninterrupted run would take, and on CPU reaches the same weights bit for bit (tested by killing
a training process).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pe_interp.config.model import ModelConfig, TrainConfig, check_device, check_run_configs
from pe_interp.models.hooked import attn_routes
from pe_interp.runs.arch import build_model, save_hf
from pe_interp.runs.checkpoint import CONFIG, CONFIG_KEYS, METRICS, CheckpointError, append_jsonl
from pe_interp.runs.snapshots import SnapshotWriter, snapshot_schedule
from pe_interp.training.callbacks import Callback
from pe_interp.training.evaluation import autocast_for, evaluate
from pe_interp.training.state import RunDirectory
from pe_interp.util import interrupts
from pe_interp.util.io import dir_lock

# config.json keys the Trainer writes itself (not given through extra_config)
_OWN_KEYS = ("model", "task", "train", "version", "numerics")

# config.json keys the Trainer writes itself (not given through extra_config)
_OWN_KEYS = ("model", "task", "train", "version", "numerics")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is left in place."""


@dataclass
class TrainResult:
    final: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None
    model: Any = None  # the trained HookedPETransformer


class Trainer(RunDirectory):
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
        self.model_cfg, self.task, self.train_cfg = model_cfg, task, train_cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.callbacks = list(callbacks)
        self.progress = progress
        self.extra_config = extra_config or {}
        bad = sorted(
            set(self.extra_config) - set(CONFIG_KEYS) | set(self.extra_config) & set(_OWN_KEYS)
        )
        if bad:
            raise ValueError(
                f"Trainer: extra_config key(s) {', '.join(map(repr, bad))} are not config.json keys; allowed: "
                + ", ".join(k for k in CONFIG_KEYS if k not in _OWN_KEYS)
            )
        check_run_configs(model_cfg, train_cfg)
        self.device = torch.device(check_device(train_cfg.device, "TrainConfig.device"))
        self.model = build_model(model_cfg).to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=train_cfg.lr,
            betas=train_cfg.betas,
            weight_decay=train_cfg.weight_decay,
        )
        self.step = 0
        self.stopped = False  # reached TrainConfig.stop_at_acc (the run is finished before its cap)
        # Training loss and accuracy summed since the last evaluation; saved with checkpoints so
        # that the record after a resume covers the steps before the crash too.
        self.running = {"loss": 0.0, "correct": 0, "seen": 0}
        self.train, self.test = task.splits(
            train_cfg.n_train, train_cfg.n_test, seed=train_cfg.seed
        )
        self.snapshots = None  # a SnapshotWriter when TrainConfig.snapshots keeps weights
        if train_cfg.snapshots != "none":
            if self.run_dir is None:
                raise ValueError(
                    f"TrainConfig.snapshots={train_cfg.snapshots!r} needs a run directory to keep them in "
                    "(run_dir=..., --out)"
                )
            steps = snapshot_schedule(
                train_cfg.total_steps, train_cfg.snapshot_interval, train_cfg.snapshots
            )
            self.snapshots = SnapshotWriter(self.run_dir, steps)

    # ---- training ----------------------------------------------------------------------------
    def epoch_order(self, epoch: int) -> torch.Tensor:
        # within 64 bits for every seed (the same number for seeds below 2**44, as before)
        gen = torch.Generator().manual_seed((self.train_cfg.seed * 1_000_003 + epoch) % (1 << 64))
        return torch.randperm(self.train_cfg.n_train, generator=gen)

    def fit(self, resume: bool = False) -> TrainResult:
        """Train to the end (or to ``stop_at_acc``). With a run directory, it is locked while
        written (another writer gets a one-line error), a directory that holds a run is only
        continued (``resume``, with the same config), and SIGINT/SIGTERM stop after the current
        step with a checkpoint (:class:`~pe_interp.util.interrupts.Interrupted`)."""
        with interrupts.deferred():
            if self.run_dir is None:
                torch.manual_seed(self.train_cfg.seed)
                attn_routes.reset()  # a fresh run's routes owe nothing to earlier runs
                return self._fit()
            if self.run_dir.exists() and not self.run_dir.is_dir():
                raise CheckpointError(
                    f"{self.run_dir}: exists and is not a directory; choose a new run directory"
                )
            if resume and not (self.run_dir / CONFIG).is_file():
                what = (
                    "does not exist"
                    if not self.run_dir.exists()
                    else f"holds no run ({CONFIG} missing)"
                )
                raise CheckpointError(
                    f"{self.run_dir}: nothing to resume, the directory {what}; "
                    "start the run without resume (--resume)"
                )
            with dir_lock(
                self.run_dir, "run directory", hint="wait for it to end, or use another --out"
            ):
                self._open_run_dir(resume)
                return self._fit()

    def _fit(self) -> TrainResult:
        cfg = self.train_cfg
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
        run = self.running
        ignore = -100 if cfg.ignore_index is None else cfg.ignore_index
        t0 = time.time()
        if self.snapshots is not None:
            self.snapshots.start(self.step, model)
        try:
            while self.step < total and not self.stopped:
                epoch, offset = divmod(self.step, cfg.steps_per_epoch)
                order = self.epoch_order(epoch)
                idx = order[offset * cfg.batch_size : (offset + 1) * cfg.batch_size]
                part = self.train[idx].to(self.device)
                for group in opt.param_groups:
                    group["lr"] = cfg.lr_at(self.step)
                with autocast_for(self.device, cfg.amp):
                    logits = model(part.tokens, part.pad_mask)
                counted = part.labels != ignore
                n_counted = int(counted.sum())
                if n_counted == 0:  # every label ignored: nothing to learn from this batch
                    loss = logits.float().sum() * 0.0
                else:
                    loss = F.cross_entropy(logits.float(), part.labels, ignore_index=ignore)
                if not torch.isfinite(loss):
                    where = (
                        f"; the last good checkpoint (step {last_good}) is in {self.run_dir}"
                        if self.run_dir
                        else ""
                    )
                    raise NonFiniteLossError(
                        f"non-finite loss ({loss.item()}) at step {self.step + 1}{where}"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                self.step += 1
                loss_value = loss.item()
                run["loss"] += loss_value * n_counted
                run["correct"] += int(((logits.argmax(-1) == part.labels) & counted).sum())
                run["seen"] += n_counted
                for cb in self.callbacks:
                    cb.on_step(self, self.step, loss_value)
                if bar is not None:
                    bar.update(1)
                if self.step % eval_every == 0 or self.step == total:
                    test = evaluate(
                        model, self.test, cfg.eval_batch_size, cfg.amp, cfg.ignore_index
                    )
                    record = {
                        "step": self.step,
                        "epoch": self.step / cfg.steps_per_epoch,
                        "lr": cfg.lr_at(self.step - 1),
                        "train_loss": run["loss"] / max(run["seen"], 1),
                        "train_acc": run["correct"] / max(run["seen"], 1),
                        "test_loss": test["loss"],
                        "test_acc": test["acc"],
                        "seconds": round(time.time() - t0, 3),
                    }
                    run.update(loss=0.0, correct=0, seen=0)
                    history.append(record)
                    if self.run_dir is not None:
                        append_jsonl(self.run_dir / METRICS, record)
                    self.stopped = 0 < cfg.stop_at_acc <= record["test_acc"]
                    for cb in self.callbacks:
                        cb.on_eval(self, self.step, record)
                    if bar is not None:
                        bar.set_postfix(
                            loss=f"{record['train_loss']:.3f}", test_acc=f"{record['test_acc']:.3f}"
                        )
                if (
                    self.snapshots is not None
                ):  # before the checkpoint: a resume never skips a snapshot
                    self.snapshots.maybe_save(self.step, model, last=self.stopped)
                if self.step % ckpt_every == 0 or self.step == total or self.stopped:
                    self.save_checkpoint()
                    last_good = self.step
                if (signum := interrupts.requested()) is not None:
                    self._interrupt(signum, last_good)
        finally:
            if bar is not None:
                bar.close()
        if self.run_dir is not None:
            save_hf(
                self.run_dir, model
            )  # an architecture's run: also a saved Hugging Face model (RUN/hf/)
        for cb in self.callbacks:
            cb.on_train_end(self)
        final = (
            history[-1]
            if history
            else {
                "step": self.step,
                **_prefixed(
                    evaluate(model, self.test, cfg.eval_batch_size, cfg.amp, cfg.ignore_index)
                ),
            }
        )
        return TrainResult(final=final, history=history, run_dir=self.run_dir, model=self.model)

    def _interrupt(self, signum: int, last_good: int) -> None:
        """Save a checkpoint at this step (a step boundary: a resume replays exactly) and stop."""
        if self.run_dir is not None and last_good != self.step:
            self.save_checkpoint()
        where = (
            (
                f"the run is saved in {self.run_dir} at step {self.step}: continue it with resume=True "
                "(the same command with --resume)"
            )
            if self.run_dir is not None
            else "no run directory, nothing saved"
        )
        raise interrupts.Interrupted(
            f"stopped by {interrupts.signal_name(signum)} at step {self.step} of "
            f"{self.train_cfg.total_steps}; {where}",
            signum,
        )


def _prefixed(metrics: dict[str, float]) -> dict[str, float]:
    return {f"test_{k}": v for k, v in metrics.items()}


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, leave=False
    )


__all__ = ["NonFiniteLossError", "TrainConfig", "TrainResult", "Trainer", "evaluate"]

"""Deposit dynamics: watching the single-head deposit form during training.

:class:`DepositDynamics` is a training callback that repeats the layer-0 zero-ablation sweep on a
fixed probe batch every few steps, recording each head's drop and the margin between the first
and second head (:func:`probes.deposit.layer_stats`): the quantity of the paper's Theorem 6.1,
which the paper never measured over training. :func:`load_dynamics` reads the records back and
:func:`dynamics_arrays` turns one layer's into arrays.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pe_interp.training.callbacks import Callback
from pe_interp.util.io import append_jsonl, nan_float, read_jsonl, to_json, write_jsonl
from probes.ablation import ablate_heads
from probes.deposit.detection import layer_stats

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

DYNAMICS_FILE = "deposit_dynamics.jsonl"

__all__ = ["DYNAMICS_FILE", "DepositDynamics", "dynamics_arrays", "load_dynamics"]


def load_dynamics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``deposit_dynamics.jsonl`` file (a run dir is accepted too); a torn last
    line (a crash mid-write) is skipped (:func:`pe_interp.util.io.read_jsonl`)."""
    path = Path(path)
    if path.is_dir():
        path = path / DYNAMICS_FILE
    return read_jsonl(path)


def dynamics_arrays(records: Sequence[dict[str, Any]], layer: int = 0) -> dict[str, np.ndarray]:
    """One layer's records as arrays sorted by step: ``steps [T]``, ``drops [T, H]``,
    ``values [T, H]``, ``baseline [T]``, ``margin [T]``, ``share [T]``, ``top_head [T]``."""
    rows = sorted((r for r in records if r["layer"] == layer), key=lambda r: r["step"])
    if not rows:
        raise ValueError(f"no dynamics records for layer {layer}")

    def arr(key):
        return np.array(
            [
                [nan_float(x) for x in r[key]] if isinstance(r[key], list) else nan_float(r[key])
                for r in rows
            ]
        )

    return {
        "steps": np.array([r["step"] for r in rows]),
        "drops": arr("drops"),
        "values": arr("values"),
        "baseline": arr("baseline"),
        "margin": arr("margin"),
        "share": arr("share"),
        "top_head": np.array([r["top_head"] for r in rows]),
    }


class DepositDynamics(Callback):
    """Training callback: the per-head ablation drops of some layers, every ``every`` steps.

    On a fixed probe batch (``probe``: anything with ``tokens``, ``labels``, ``pad_mask``; by
    default the first ``n_probe`` examples of the trainer's held-out split, without the rows of
    the class the loss ignores: what the ablation probe evaluates, :meth:`Run.examples`) it runs
    :func:`~probes.ablation.ablate_heads` on ``layers`` (default ``[0]``) and records, per
    layer, each head's drop and the first-to-second margin (plus baseline, share, entropy). With
    ``at_start`` it also records step 0 (initialisation, where the theory's "seed" lives), and
    with ``at_end`` the final step when it is not a multiple of ``every``. Early in training,
    when accuracy sits near chance, ``metric="loss"`` gives a smoother curve.

    It does not change training: it runs under ``torch.no_grad()`` in eval mode (each module's
    train/eval flag is restored), and inside ``torch.random.fork_rng`` so the global RNG
    (dropout, shuffling) is left exactly as it was. Records go to ``.records`` and, when
    ``trainer.run_dir`` is set, are appended to ``run_dir / "deposit_dynamics.jsonl"`` (one JSON
    object per step and layer). On resume (``trainer.step > 0`` at ``on_train_start``) records
    after ``trainer.step`` are dropped from the file and the rest are loaded.
    """

    def __init__(
        self,
        every: int = 100,
        layers: Sequence[int] = (0,),
        *,
        probe: Any = None,
        n_probe: int = 512,
        metric: str = "accuracy",
        method: str = "zero",
        batch_size: int | None = None,
        at_start: bool = True,
        at_end: bool = True,
        filename: str = DYNAMICS_FILE,
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"DepositDynamics.every must be a positive integer, got {every!r}")
        self.every = every
        self.layers = [int(x) for x in layers]
        self.probe = probe
        self.n_probe = n_probe
        self.metric = metric
        self.method = method
        self.batch_size = batch_size
        self.at_start = at_start
        self.at_end = at_end
        self.filename = filename
        self.records: list[dict[str, Any]] = []
        self._probe_dev: Any = None

    # ---- helpers ----------------------------------------------------------------------------
    def path(self, trainer) -> Path | None:
        run_dir = getattr(trainer, "run_dir", None)
        return None if run_dir is None else Path(run_dir) / self.filename

    @staticmethod
    def _rng_devices(model: ProbeModel) -> list[int]:
        dev = model.W_E.device
        if dev.type != "cuda":
            return []
        return [dev.index if dev.index is not None else torch.cuda.current_device()]

    def _get_probe(self, trainer):
        model = trainer.model
        dev = model.W_E.device
        if self._probe_dev is None or self._probe_dev[0] != dev:
            if self.probe is None:
                test, ignore = trainer.test, trainer.train_cfg.ignore_index
                if ignore is not None:
                    test = test[test.labels != ignore]
                self.probe = test[: self.n_probe]
            p = self.probe
            self._probe_dev = (dev, p.tokens.to(dev), p.labels.to(dev), p.pad_mask.to(dev))
        return self._probe_dev[1:]

    def measure(self, trainer, step: int) -> list[dict[str, Any]]:
        """Run the sweep now and return (and keep, and write) this step's records."""
        model = trainer.model
        tokens, labels, pad_mask = self._get_probe(trainer)
        with torch.random.fork_rng(devices=self._rng_devices(model)), torch.no_grad():
            res = ablate_heads(
                model,
                tokens,
                labels,
                pad_mask=pad_mask,
                method=self.method,
                metric=self.metric,
                layers=self.layers,
                n_bootstrap=0,
                batch_size=self.batch_size,
            )
        new = []
        for layer in self.layers:
            s = layer_stats(res.drops[layer], layer=layer, require_separation=False)
            new.append(
                {
                    "step": int(step),
                    "layer": layer,
                    "method": res.method,
                    "metric": res.metric,
                    "n_probe": res.n_examples,
                    "baseline": res.baseline,
                    "values": [to_json(x) for x in res.values[layer]],
                    "drops": [to_json(x) for x in res.drops[layer]],
                    "top_head": s.top_head,
                    "top_drop": to_json(s.top_drop),
                    "second_head": s.second_head,
                    "second_drop": to_json(s.second_drop),
                    "margin": to_json(s.margin),
                    "share": to_json(s.share),
                    "entropy": to_json(s.entropy),
                }
            )
        self.records.extend(new)
        path = self.path(trainer)
        if path is not None:
            append_jsonl(path, new)
        return new

    # ---- callback interface -----------------------------------------------------------------
    def on_train_start(self, trainer) -> None:
        path = self.path(trainer)
        self.records = []
        if trainer.step > 0:
            if path is not None and path.exists():
                kept = [r for r in load_dynamics(path) if r["step"] <= trainer.step]
                write_jsonl(path, kept)
                self.records = kept
            return
        if path is not None and path.exists():
            path.unlink()  # a fresh run starts a fresh file
        if self.at_start:
            self.measure(trainer, 0)

    def on_step(self, trainer, step: int, loss: float) -> None:
        if step % self.every == 0:
            self.measure(trainer, step)

    def on_train_end(self, trainer) -> None:
        if (
            self.at_end
            and trainer.step > 0
            and not any(r["step"] == trainer.step for r in self.records)
        ):
            self.measure(trainer, trainer.step)

"""The single-head deposit pattern: detecting it in an ablation sweep, and watching it form.

:func:`find_deposits` reads an :class:`~probes.ablation.AblationResult` layer by layer and says
whether one head carries (almost) all of what the layer contributes: the paper's "single-head
deposit pattern" (digest §6), which the paper itself judged by eye from per-layer line plots.

:class:`DepositDynamics` is a training callback that repeats the layer-0 zero-ablation sweep on a
fixed probe batch every few steps, recording each head's drop and the margin between the first
and second head: the quantity of the paper's Theorem 6.1, which the paper never measured over
training.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pe_interp.callbacks import Callback
from probes.ablation import AblationResult, Head, ablate_heads

DEFAULT_MIN_DROP_ACCURACY = 0.2
DEFAULT_MIN_SHARE = 0.5
DYNAMICS_FILE = "deposit_dynamics.jsonl"


def _f(x: Any) -> float | None:
    """float for JSON, with NaN as None."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


# ------------------------------------------------------------------------------------------------
# Concentration of one layer's drops
# ------------------------------------------------------------------------------------------------
def normalized_entropy(x: np.ndarray) -> float:
    """Entropy of ``x / x.sum()`` divided by ``log(len(x))``: 0 when one entry holds everything,
    1 when all are equal. ``x`` must be non-negative; NaN when it sums to 0 or has < 2 entries."""
    x = np.asarray(x, dtype=np.float64)
    s = x.sum()
    if len(x) < 2 or s <= 0:
        return float("nan")
    p = x[x > 0] / s
    return float(-(p * np.log(p)).sum() / math.log(len(x))) + 0.0  # no -0.0


def normalized_gini(x: np.ndarray) -> float:
    """Gini coefficient of non-negative ``x``, scaled by ``n / (n - 1)`` so that one non-zero
    entry gives 1 and equal entries give 0. NaN when ``x`` sums to 0 or has < 2 entries."""
    x = np.asarray(x, dtype=np.float64)
    n, s = len(x), x.sum()
    if n < 2 or s <= 0:
        return float("nan")
    g = np.abs(x[:, None] - x[None, :]).sum() / (2.0 * n * s)
    return float(g * n / (n - 1))


@dataclass(frozen=True)
class LayerDeposit:
    """One layer's verdict (see :func:`find_deposits`); drops are positive when ablation hurt."""

    layer: int
    top_head: int
    top_drop: float
    top_ci: tuple[float, float]  # NaN when the sweep had no bootstrap
    second_head: int | None
    second_drop: float
    margin: float  # top_drop - second_drop
    share: float  # top head's share of the layer's summed positive drops
    entropy: float  # normalised entropy of the positive drops (0 = one head, 1 = uniform)
    gini: float  # normalised Gini of the positive drops (1 = one head, 0 = uniform)
    ci_separated: bool | None  # top CI's lower bound > second head's drop (None: no CI)
    is_deposit: bool
    failed: tuple[str, ...] = ()  # the criteria that were not met

    @property
    def head(self) -> Head:
        return (self.layer, self.top_head)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "top_head": self.top_head,
            "top_drop": _f(self.top_drop),
            "top_ci": [_f(self.top_ci[0]), _f(self.top_ci[1])],
            "second_head": self.second_head,
            "second_drop": _f(self.second_drop),
            "margin": _f(self.margin),
            "share": _f(self.share),
            "entropy": _f(self.entropy),
            "gini": _f(self.gini),
            "ci_separated": self.ci_separated,
            "is_deposit": self.is_deposit,
            "failed": list(self.failed),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerDeposit:
        return cls(
            layer=int(d["layer"]),
            top_head=int(d["top_head"]),
            top_drop=_nan(d["top_drop"]),
            top_ci=(_nan(d["top_ci"][0]), _nan(d["top_ci"][1])),
            second_head=d["second_head"],
            second_drop=_nan(d["second_drop"]),
            margin=_nan(d["margin"]),
            share=_nan(d["share"]),
            entropy=_nan(d["entropy"]),
            gini=_nan(d["gini"]),
            ci_separated=d["ci_separated"],
            is_deposit=bool(d["is_deposit"]),
            failed=tuple(d.get("failed", ())),
        )


def layer_stats(
    drops: np.ndarray,
    ci_low: np.ndarray | None = None,
    ci_high: np.ndarray | None = None,
    *,
    layer: int = 0,
    min_drop: float = DEFAULT_MIN_DROP_ACCURACY,
    min_share: float = DEFAULT_MIN_SHARE,
    require_separation: bool = True,
) -> LayerDeposit | None:
    """The :class:`LayerDeposit` of one layer's per-head drops (NaN = head not swept)."""
    drops = np.asarray(drops, dtype=np.float64)
    heads = np.flatnonzero(~np.isnan(drops))
    if len(heads) == 0:
        return None
    d = drops[heads]
    order = np.argsort(-d, kind="stable")
    top = int(heads[order[0]])
    top_drop = float(d[order[0]])
    second = int(heads[order[1]]) if len(heads) > 1 else None
    second_drop = float(d[order[1]]) if len(heads) > 1 else float("nan")
    pos = np.clip(d, 0.0, None)
    total = pos.sum()
    share = float(pos[order[0]] / total) if total > 0 else float("nan")
    lo = float(ci_low[top]) if ci_low is not None else float("nan")
    hi = float(ci_high[top]) if ci_high is not None else float("nan")
    separated = None if (math.isnan(lo) or second is None) else bool(lo > second_drop)
    failed = []
    if not top_drop >= min_drop or not top_drop > 0:
        failed.append(f"top drop {top_drop:.3g} < min_drop {min_drop:.3g}")
    if not share >= min_share:
        failed.append(f"share {share:.3g} < min_share {min_share:.3g}")
    if require_separation and separated is False:
        failed.append(f"CI low {lo:.3g} of the top head does not exceed the second head's drop {second_drop:.3g}")
    return LayerDeposit(
        layer=layer,
        top_head=top,
        top_drop=top_drop,
        top_ci=(lo, hi),
        second_head=second,
        second_drop=second_drop,
        margin=top_drop - second_drop,
        share=share,
        entropy=normalized_entropy(pos),
        gini=normalized_gini(pos),
        ci_separated=separated,
        is_deposit=not failed,
        failed=tuple(failed),
    )


@dataclass(frozen=True)
class DepositReport:
    """Per-layer deposit verdicts of one ablation sweep (see :func:`find_deposits`)."""

    layers: tuple[LayerDeposit, ...]
    deposits: tuple[Head, ...]
    metric: str
    method: str
    baseline: float
    min_drop: float
    min_share: float
    require_separation: bool

    def layer(self, layer: int) -> LayerDeposit:
        for s in self.layers:
            if s.layer == layer:
                return s
        raise KeyError(f"layer {layer} is not in this report")

    def to_dict(self) -> dict[str, Any]:
        return {
            "deposits": [list(h) for h in self.deposits],
            "layers": [s.to_dict() for s in self.layers],
            "metric": self.metric,
            "method": self.method,
            "baseline": self.baseline,
            "thresholds": {
                "min_drop": self.min_drop,
                "min_share": self.min_share,
                "require_separation": self.require_separation,
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DepositReport:
        t = d["thresholds"]
        return cls(
            layers=tuple(LayerDeposit.from_dict(s) for s in d["layers"]),
            deposits=tuple((int(a), int(b)) for a, b in d["deposits"]),
            metric=d["metric"],
            method=d["method"],
            baseline=float(d["baseline"]),
            min_drop=float(t["min_drop"]),
            min_share=float(t["min_share"]),
            require_separation=bool(t["require_separation"]),
        )

    def summary(self) -> str:
        """A short fixed-width table, one row per layer."""
        rows = [
            f"{self.method}-ablation, metric {self.metric}, baseline {self.baseline:.4f}",
            f"{'layer':>5} {'head':>4} {'drop':>8} {'CI':>19} {'2nd':>8} {'share':>6} {'entropy':>7} deposit",
        ]
        for s in self.layers:
            ci = "" if math.isnan(s.top_ci[0]) else f"[{s.top_ci[0]:.3f}, {s.top_ci[1]:.3f}]"
            rows.append(
                f"{s.layer:>5} {s.top_head:>4} {s.top_drop:>8.4f} {ci:>19} {s.second_drop:>8.4f} "
                f"{s.share:>6.2f} {s.entropy:>7.2f} {'YES' if s.is_deposit else 'no'}"
            )
        return "\n".join(rows)


def find_deposits(
    result: AblationResult,
    *,
    min_drop: float | None = None,
    min_share: float = DEFAULT_MIN_SHARE,
    require_separation: bool = True,
    layers: Iterable[int] | None = None,
) -> DepositReport:
    """Flag the layers where a single head carries the layer's contribution.

    A layer's top head (largest drop) is flagged when all of these hold:

    1. **Large**: ``top_drop >= min_drop``. Default for ``metric="accuracy"``: **0.2** (20
       accuracy points). The paper reports a ~60-point drop from its deposit head; a third of
       that still counts as a (weaker) deposit, while 20 points is far above the sampling noise
       of held-out sets of a few thousand examples (standard error of a paired accuracy
       difference ~1 point) and above what single heads cost in models that spread their work
       (a few points). A model at chance cannot lose 20 points, so failed models are never
       flagged. For other metrics (loss, logit, callables) the units differ and there is no
       universal scale: the default is then 0 (only criteria 2-3 apply); pass a value.
    2. **Dominant**: ``share >= min_share`` (default **0.5**), where ``share`` is the top head's
       drop over the sum of the layer's positive drops: the top head hurts more than all other
       heads of the layer together. The paper's "others negligible" pattern has a share near 1;
       0.5 is the weakest level at which one head is still the majority.
    3. **Separated** (``require_separation``): the lower end of the top head's bootstrap CI is
       above the second head's drop, so the ranking is not sampling noise. Skipped (reported
       as ``ci_separated=None``) when the sweep had no bootstrap.

    Each layer also reports the margin (first minus second drop), the normalised entropy and
    Gini of its positive drops and the criteria that failed. Works on grid sweeps only.
    """
    if not result.is_grid:
        raise ValueError("find_deposits needs a layers x heads sweep, not head sets")
    if min_drop is None:
        min_drop = DEFAULT_MIN_DROP_ACCURACY if result.metric == "accuracy" else 0.0
    wanted = range(result.n_layers) if layers is None else sorted(set(layers))
    stats = []
    for layer in wanted:
        s = layer_stats(
            result.drops[layer], result.ci_low[layer], result.ci_high[layer], layer=layer,
            min_drop=min_drop, min_share=min_share, require_separation=require_separation,
        )  # fmt: skip
        if s is not None:
            stats.append(s)
    return DepositReport(
        layers=tuple(stats),
        deposits=tuple(s.head for s in stats if s.is_deposit),
        metric=result.metric,
        method=result.method,
        baseline=result.baseline,
        min_drop=float(min_drop),
        min_share=float(min_share),
        require_separation=bool(require_separation),
    )


# ------------------------------------------------------------------------------------------------
# Dynamics over training
# ------------------------------------------------------------------------------------------------
def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_dynamics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``deposit_dynamics.jsonl`` file (a run dir is accepted too); a torn last
    line (a crash mid-write) is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / DYNAMICS_FILE
    records = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
    return records


def dynamics_arrays(records: Sequence[dict[str, Any]], layer: int = 0) -> dict[str, np.ndarray]:
    """One layer's records as arrays sorted by step: ``steps [T]``, ``drops [T, H]``,
    ``values [T, H]``, ``baseline [T]``, ``margin [T]``, ``share [T]``, ``top_head [T]``."""
    rows = sorted((r for r in records if r["layer"] == layer), key=lambda r: r["step"])
    if not rows:
        raise ValueError(f"no dynamics records for layer {layer}")

    def arr(key):
        return np.array([[_nan(x) for x in r[key]] if isinstance(r[key], list) else _nan(r[key]) for r in rows])

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
    default ``n_probe`` examples sampled once from ``trainer.task`` with ``probe_seed``) it runs
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
        probe_seed: int = 20250519,
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
        self.probe_seed = probe_seed
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
    def _rng_devices(model) -> list[int]:
        dev = model.W_E.device
        if dev.type != "cuda":
            return []
        return [dev.index if dev.index is not None else torch.cuda.current_device()]

    def _get_probe(self, trainer):
        model = trainer.model
        dev = model.W_E.device
        if self._probe_dev is None or self._probe_dev[0] != dev:
            if self.probe is None:
                with torch.random.fork_rng(devices=self._rng_devices(model)):
                    self.probe = trainer.task.sample(self.n_probe, seed=self.probe_seed)
            p = self.probe
            self._probe_dev = (dev, p.tokens.to(dev), p.labels.to(dev), p.pad_mask.to(dev))
        return self._probe_dev[1:]

    def measure(self, trainer, step: int) -> list[dict[str, Any]]:
        """Run the sweep now and return (and keep, and write) this step's records."""
        model = trainer.model
        tokens, labels, pad_mask = self._get_probe(trainer)
        with torch.random.fork_rng(devices=self._rng_devices(model)), torch.no_grad():
            res = ablate_heads(
                model, tokens, labels, pad_mask=pad_mask, method=self.method, metric=self.metric,
                layers=self.layers, n_bootstrap=0, batch_size=self.batch_size,
            )  # fmt: skip
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
                    "values": [_f(x) for x in res.values[layer]],
                    "drops": [_f(x) for x in res.drops[layer]],
                    "top_head": s.top_head,
                    "top_drop": _f(s.top_drop),
                    "second_head": s.second_head,
                    "second_drop": _f(s.second_drop),
                    "margin": _f(s.margin),
                    "share": _f(s.share),
                    "entropy": _f(s.entropy),
                }
            )
        self.records.extend(new)
        path = self.path(trainer)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in new))
                f.flush()
        return new

    # ---- callback interface -----------------------------------------------------------------
    def on_train_start(self, trainer) -> None:
        path = self.path(trainer)
        self.records = []
        if trainer.step > 0:
            if path is not None and path.exists():
                kept = [r for r in load_dynamics(path) if r["step"] <= trainer.step]
                _atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
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
        if self.at_end and trainer.step > 0 and not any(r["step"] == trainer.step for r in self.records):
            self.measure(trainer, trainer.step)


__all__ = [
    "DEFAULT_MIN_DROP_ACCURACY",
    "DEFAULT_MIN_SHARE",
    "DYNAMICS_FILE",
    "DepositDynamics",
    "DepositReport",
    "LayerDeposit",
    "dynamics_arrays",
    "find_deposits",
    "layer_stats",
    "load_dynamics",
    "normalized_entropy",
    "normalized_gini",
]

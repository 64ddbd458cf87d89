"""Length generalisation: a trained model scored, with the same labels, on inputs it never saw.

The task says how to make its inputs longer (:meth:`pe_interp.tasks.SyntheticTask.extended`):
``"shift"`` translates what decides the label (more fillers before it), ``"right"`` lengthens
after it, ``"sides"`` does both by halves, ``"length"`` lengthens a shuffled fixed-length task
(task 2: counts stay in the trained range). Each (family, extra) pair is a :class:`Condition`,
scored on ``n`` fresh rows drawn from the extended task's ``sample(n, seed)`` stream; the
``"trained"`` condition is the task itself on the same stream. Rows equal to a training row
(``exclude``) are dropped before scoring, so no condition overlaps the training set.

Inputs longer than the model's ``n_ctx`` need a model with a larger ``n_ctx`` and the same weights
(:func:`widened`): a model of the same config with ``n_ctx`` raised is built and the trained state
loaded into it. Positions that the encoding *computes* (sinusoid, RoPE angles, ALiBi distances,
T5 log buckets, nothing for NoPE) live in non-persistent buffers and are recomputed at the new
size; a *parameter* whose shape follows ``n_ctx`` (a learned position table, T5's full offset
table) has no trained value for the new positions, and then the longer conditions are recorded
as not evaluated, with the reason, instead of failing. Nothing here asks what the encoding is.

A model that attends to pads (``mask_padding=False``, the authors') sees each condition padded to
that condition's ``max_len`` (training length + ``extra``), as a generator with a longer limit
would pad it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pe_interp.tasks import Batch, SyntheticTask, row_hashes, task_from_dict
from pe_interp.util.io import load_result, register_result, write_result
from pe_interp.util.modes import eval_mode
from probes.common.metrics import wilson

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

TRAINED = "trained"
RESULT_KIND = register_result(
    "length generalisation",
    "GeneralizationResult.load",
    ("task", "encoding", "n_ctx", "conditions"),
)
# Extra lengths as fractions of the training length (up to 2x the training length).
DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Condition:
    """One way of lengthening the inputs and the model's score on it (``correct`` of ``n``;
    ``correct is None``: not evaluated, ``note`` says why)."""

    family: str
    extra: int
    max_len: int  # the longest input of the condition (its padded width)
    n: int
    correct: int | None
    chance: float  # of the extended task (exact)
    length_only: float  # Bayes accuracy from the length alone, of the extended task (exact)
    dropped: int = 0  # rows equal to a training row, left out
    note: str = ""

    @property
    def evaluated(self) -> bool:
        return self.correct is not None

    @property
    def accuracy(self) -> float:
        return math.nan if self.correct is None or self.n == 0 else self.correct / self.n

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Wilson interval of the accuracy (NaN when not evaluated)."""
        return (math.nan, math.nan) if self.correct is None else wilson(self.correct, self.n, level)

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.interval()
        return {
            "family": self.family,
            "extra": self.extra,
            "max_len": self.max_len,
            "n": self.n,
            "correct": self.correct,
            "accuracy": self.accuracy,
            "wilson95": [lo, hi],
            "chance": self.chance,
            "length_only": self.length_only,
            "dropped": self.dropped,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Condition:
        correct = d.get("correct")
        return cls(
            str(d["family"]),
            int(d["extra"]),
            int(d["max_len"]),
            int(d["n"]),
            None if correct is None else int(correct),
            float(d["chance"]),
            float(d["length_only"]),
            int(d.get("dropped", 0)),
            str(d.get("note", "")),
        )


@dataclass(frozen=True, eq=False)
class GeneralizationResult:
    """The outcome of :func:`length_generalization`: one :class:`Condition` per (family, extra),
    the ``"trained"`` one first."""

    task: dict[str, Any]  # the trained task (``to_dict``)
    encoding: str
    n_ctx: int  # the model's trained context
    conditions: tuple[Condition, ...]
    seed: int = 0
    unrepresentable: str = (
        ""  # why the conditions beyond n_ctx were not evaluated ("" if they were)
    )
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def families(self) -> list[str]:
        return list(dict.fromkeys(c.family for c in self.conditions if c.family != TRAINED))

    def condition(self, family: str, extra: int = 0) -> Condition:
        for c in self.conditions:
            if c.family == family and (family == TRAINED or c.extra == extra):
                return c
        raise KeyError(f"no condition {family!r} with extra {extra}")

    @property
    def trained(self) -> Condition:
        return self.condition(TRAINED)

    def family_mean(self, family: str) -> float:
        """Mean accuracy over the family's conditions with ``extra > 0`` (NaN if none evaluated)."""
        accs = [
            c.accuracy
            for c in self.conditions
            if c.family == family and c.extra > 0 and c.evaluated
        ]
        return sum(accs) / len(accs) if accs else math.nan

    def summary(self) -> str:
        lines = [
            f"{self.encoding} on {self.task.get('name')} (trained n_ctx {self.n_ctx}), seed {self.seed}"
        ]
        for c in self.conditions:
            head = f"  {c.family:8s} +{c.extra:<4d} (≤ {c.max_len:3d} tokens)"
            if not c.evaluated:
                lines.append(f"{head}: not evaluated")
                continue
            lo, hi = c.interval()
            lines.append(
                f"{head}: {100 * c.accuracy:5.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] of {c.n}"
                f"  (chance {100 * c.chance:.1f}%, length-only {100 * c.length_only:.1f}%)"
            )
        if self.unrepresentable:
            lines.append(f"  not evaluated beyond n_ctx: {self.unrepresentable}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "encoding": self.encoding,
            "n_ctx": self.n_ctx,
            "seed": self.seed,
            "unrepresentable": self.unrepresentable,
            "meta": self.meta,
            "conditions": [c.to_dict() for c in self.conditions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GeneralizationResult:
        return cls(
            dict(d["task"]),
            str(d["encoding"]),
            int(d["n_ctx"]),
            tuple(Condition.from_dict(c) for c in d["conditions"]),
            int(d.get("seed", 0)),
            str(d.get("unrepresentable", "")),
            dict(d.get("meta", {})),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> GeneralizationResult:
        return load_result(path, RESULT_KIND, cls.from_dict)

    @property
    def task_obj(self) -> SyntheticTask:
        return task_from_dict(self.task)


def widened(model: ProbeModel, n_ctx: int) -> tuple[ProbeModel | None, str]:
    """``(model, "")`` when ``n_ctx`` fits, else a model with ``n_ctx`` positions and the same
    trained weights, or ``(None, why)`` when a trained parameter has one entry per position."""
    cfg = model.cfg
    if n_ctx <= cfg.n_ctx:
        return model, ""
    from pe_interp.models.hooked.model import HookedPETransformer

    wide = HookedPETransformer(cfg.replace(n_ctx=n_ctx, device="cpu"))
    state, target = model.state_dict(), wide.state_dict()
    grown = [
        f"{k} {tuple(v.shape)}"
        for k, v in state.items()
        if k in target and target[k].shape != v.shape
    ]
    if grown:
        return None, (
            f"{cfg.encoding_name}: trained parameter {', '.join(grown)} has one entry per position of "
            f"n_ctx={cfg.n_ctx}; positions beyond it have no trained value"
        )
    wide.load_state_dict(state)
    return wide.to(model.W_E.device).eval(), ""


def _score(model: ProbeModel, batch: Batch, batch_size: int) -> int:
    device = model.W_E.device
    correct = 0
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(batch), batch_size):
            rows = batch[start : start + batch_size].to(device)
            logits = model(rows.tokens, rows.pad_mask)
            correct += int((logits.argmax(-1) == rows.labels).sum())
    return correct


def _without(batch: Batch, exclude_keys: Tensor | None, exclude_width: int) -> tuple[Batch, int]:
    """``batch`` without the rows equal to an excluded row (compared at ``batch``'s width)."""
    if exclude_keys is None or len(batch) == 0:
        return batch, 0
    if batch.max_len < exclude_width:
        raise ValueError("length_generalization: a condition is narrower than the excluded rows")
    # Rows are right-padded with PAD_ID = 0: the excluded rows, padded to this width, are hashed
    # at it, so equal sequences get equal keys.
    keep = ~torch.isin(row_hashes(batch.tokens), exclude_keys[batch.max_len])
    return batch[keep], int((~keep).sum())


def length_generalization(
    model: ProbeModel,
    task: SyntheticTask,
    *,
    n: int = 1000,
    extras: Sequence[int] | None = None,
    families: Sequence[str] | None = None,
    exclude: Batch | None = None,
    ignore_index: int | None = None,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool = False,
) -> GeneralizationResult:
    """Score ``model`` (trained on ``task``) on longer inputs with the same labels.

    ``extras``: how many tokens longer (default: 1/4, 1/2, 3/4 and all of ``task.max_len``, i.e.
    up to twice the training length); ``families``: default every one of ``task.extensions``;
    ``exclude``: the training rows, left out of every condition; ``ignore_index``: a class left
    out of scoring, as the run's loss ignores it. Every condition draws ``n`` rows from the
    extended task's ``sample(n, seed)`` stream (so conditions are paired draws where the task's
    generator allows).
    """
    extras, families = _check_args(model, task, n, extras, families)
    wide, why = widened(model, task.max_len + max(extras))
    exclude_keys = _exclude_keys(task, extras, exclude)
    plan = [(TRAINED, 0)] + [(f, e) for f in families for e in extras]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan), desc="generalize", unit="condition", leave=False)
    conditions = []
    for family, extra in plan:
        t = task if family == TRAINED else task.extended(family, extra)
        scorer = model if t.max_len <= model.cfg.n_ctx else wide
        if scorer is None:
            chance, length_only = t.chance_accuracy(), t.length_only_accuracy()
            conditions.append(
                Condition(family, extra, t.max_len, 0, None, chance, length_only, note=why)
            )
        else:
            width = exclude.max_len if exclude is not None else 0
            conditions.append(
                _condition(
                    scorer, t, family, extra, n, seed, ignore_index, exclude_keys, width, batch_size
                )
            )
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return GeneralizationResult(
        task=task.to_dict(),
        encoding=model.cfg.encoding_name,
        n_ctx=model.cfg.n_ctx,
        conditions=tuple(conditions),
        seed=seed,
        unrepresentable=why,
        meta={
            "extras": extras,
            "families": families,
            "n": n,
            "ignore_index": ignore_index,
            "padded_to": "condition max_len"
            if not model.cfg.mask_padding
            else "masked (width has no effect)",
        },
    )


def _check_args(
    model: ProbeModel, task: SyntheticTask, n: int, extras, families
) -> tuple[list[int], list[str]]:
    """Refuse a bad ``n``, ``extras``, ``families`` or a model too short for the task; returns
    the extras and families, defaults filled in."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"length_generalization: n must be a positive integer, got {n!r}")
    if extras is None:
        extras = sorted({max(1, round(f * task.max_len)) for f in DEFAULT_FRACTIONS})
    extras = [int(e) for e in extras]
    if not extras or any(isinstance(e, bool) or e < 1 for e in extras):
        raise ValueError(
            f"length_generalization: extras must be positive integers, got {list(extras)!r}"
        )
    families = list(task.extensions if families is None else families)
    if not families:
        raise ValueError(
            f"length_generalization: task {task.name!r} has no way to lengthen its inputs"
        )
    for f in families:
        task.extended(f, 0)  # a one-line error for a family the task lacks
    if model.cfg.n_ctx < task.max_len:
        raise ValueError(
            f"length_generalization: the model's n_ctx={model.cfg.n_ctx} is below the task's "
            f"max_len={task.max_len}; was it trained on this task?"
        )
    return extras, families


def _exclude_keys(task: SyntheticTask, extras: list[int], exclude: Batch | None):
    """The training rows' hashes, padded to each width a condition has (None: nothing excluded)."""
    if exclude is None:
        return None
    widths = {task.max_len} | {task.max_len + e for e in extras}
    exclude_keys = {}
    for w in widths:
        if w < exclude.max_len:
            continue
        padded = torch.zeros(len(exclude), w, dtype=torch.long)
        padded[:, : exclude.max_len] = exclude.tokens.cpu()
        exclude_keys[w] = row_hashes(padded)
    return exclude_keys


def _condition(
    scorer, t, family, extra, n, seed, ignore_index, exclude_keys, width, batch_size
) -> Condition:
    """One condition scored: ``n`` rows of ``t`` less the ignored class and the training rows."""
    chance, length_only = t.chance_accuracy(), t.length_only_accuracy()
    batch = t.sample(n, seed=seed)
    if ignore_index is not None:
        batch = batch[batch.labels != ignore_index]
    batch, dropped = _without(batch, exclude_keys, width)
    return Condition(
        family,
        extra,
        t.max_len,
        len(batch),
        _score(scorer, batch, batch_size),
        chance,
        length_only,
        dropped,
    )


__all__ = [
    "DEFAULT_FRACTIONS",
    "TRAINED",
    "Condition",
    "GeneralizationResult",
    "length_generalization",
    "widened",
]

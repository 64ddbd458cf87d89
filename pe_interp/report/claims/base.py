"""What every claim shares: the constants, :class:`Claim`, :class:`Context` and the helpers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pe_interp.report.data import (
    LARGE_DROP,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    SMALL_DROP,
    AccStat,
    CellInfo,
)

# An encoding's task mean at or above this is "at the ceiling" (within 2 points of 100%).
CEILING = 0.98

# The paper's six PEs of Table 1 as trained by the authors' trans.py (digest §4.1), by our labels.
PAPER_SIX = ("nope", "sinusoidal", "learned", "t5", "alibi", "rope")
ADDITIVE = ("sinusoidal", "learned", "t5", "alibi")
ABSOLUTE = ("sinusoidal", "learned")

CONTROLS = ("nope", "sinusoidal", "learned", "t5", "alibi", "decoupled_rope")

DOMINANT = (
    f"a single-head deposit: exactly one head of the whole model with a drop ≥ "
    f"{100 * LARGE_DROP:.0f} points and every other head moving accuracy by ≤ {100 * SMALL_DROP:.0f} "
    "points either way (probes.deposit.dominance)"
)

PAPER_SETTING = (
    "the paper's setting is 6 layers, d_model 256, 16 heads, distances up to 71, 100 epochs "
    "(`pe-interp reproduce --preset paper`, on a GPU)"
)


@dataclass
class Claim:
    id: str
    text: str
    source: str
    criterion: str
    status: str = NOT_MEASURED
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "claim": self.text,
            "source": self.source,
            "criterion": self.criterion,
            "status": self.status,
            "evidence": self.evidence,
        }


@dataclass
class Context:
    cells: list[CellInfo]
    acc: dict[tuple[str, str], AccStat]
    baselines: dict[str, dict[str, float]]
    preset: str
    gradients: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def mean(self, label: str, task: str) -> float | None:
        s = self.acc.get((label, task))
        return None if s is None else s.mean

    def models(self, label: str, task: str) -> list[CellInfo]:
        return sorted(
            (c for c in self.cells if c.label == label and c.task == task), key=lambda c: c.seed
        )


def pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def pts(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} pts"


def acc_str(ctx: Context, label: str, task: str) -> str:
    s = ctx.acc.get((label, task))
    if s is None:
        return f"{label}: not run"
    return f"{label} {100 * s.mean:.1f} ± {100 * s.std:.1f}% (n={s.n})"


def majority(flags: list[bool]) -> bool:
    return sum(flags) * 2 > len(flags)


def missing_row(ctx: Context, labels: tuple[str, ...] | list[str], task: str) -> list[str]:
    return [lab for lab in labels if (lab, task) not in ctx.acc]


def verdict_of(ok: bool | None, missing: list[str]) -> str:
    """Conjunctive rule: a failed measured part beats a missing one."""
    if ok is False:
        return NOT_REPRODUCED
    if missing or ok is None:
        return NOT_MEASURED
    return REPRODUCED

"""The sweep's attention probe: the patterns of one chosen head's layer, kept for the report's widgets.

:func:`choose_head` picks the head (the single-head deposit if there is one, else the head whose
ablation hurts most); :func:`probe_attention` records the patterns on a few held-out examples,
all heads of its layer when they are small enough, else the chosen head and the three others that
matter most, rounded to what the widgets show (:class:`AttentionRecord`, ``attention.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pe_interp.runs.checkpoint import save_result
from pe_interp.sweep.probe_files import ABLATION, ATTENTION, DEPOSITS, ROTARY_KINDS
from pe_interp.util.io import load_result, register_result, write_result
from probes import AblationResult, AttentionPatterns, DepositReport, attention_patterns

if TYPE_CHECKING:
    from pe_interp.runs.checkpoint import Run

__all__ = [
    "ATTENTION_EXAMPLES",
    "DECIMALS",
    "MAX_WEIGHTS",
    "RESULT_KIND",
    "AttentionRecord",
    "choose_head",
]


# Attention patterns for the report's widgets: on this many held-out examples; all heads of the
# chosen layer when heads x n x n stays below MAX_WEIGHTS, else the chosen head and the three other
# heads of its layer whose ablation hurts most (so paper-size pages stay a few MB); rounded to
# DECIMALS (what the widgets show).
ATTENTION_EXAMPLES = 2
MAX_WEIGHTS = 60_000
DECIMALS = 3


RESULT_KIND = register_result(
    "attention record", "AttentionRecord.load", ("layer", "head", "why", "examples")
)


@dataclass(frozen=True, eq=False)
class AttentionRecord:
    """A cell's ``attention.json``: the head the report shows (``layer``, ``head``; ``why`` it
    was chosen) and its layer's patterns on a few held-out examples (the chosen head first, the
    others in order of ablation drop)."""

    layer: int
    head: int
    why: str
    examples: tuple[AttentionPatterns, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "why": self.why,
            "examples": [e.to_dict() for e in self.examples],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttentionRecord:
        return cls(
            int(d["layer"]),
            int(d["head"]),
            str(d["why"]),
            tuple(AttentionPatterns.from_dict(e) for e in d["examples"]),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | Path) -> AttentionRecord:
        return load_result(path, RESULT_KIND, cls.from_dict)


def choose_head(
    ablation: AblationResult, deposits: DepositReport, task: str, kind: str
) -> tuple[int, int, str] | None:
    """The head whose attention the report shows for a cell: the top head of its concentrated layer (the
    shallowest), else for a task-1 model with a rotary part the layer-0 head whose ablation hurts
    most; None otherwise."""
    if deposits.first is not None:
        layer, head = deposits.first
        return layer, head, "top head of a concentrated layer"
    if task == "distance" and kind in ROTARY_KINDS:
        top = deposits.layer(0)
        return (
            0,
            top.top_head,
            f"no layer concentration; top layer-0 head (drop {100 * top.top_drop:.1f} pts)",
        )
    return None


def probe_attention(run: Run) -> dict[str, Any] | None:
    """Attention patterns of the head :func:`choose_head` picks (needs the ablation probe first)."""
    if not (run.run_dir / ABLATION).is_file():
        return None
    ablation = AblationResult.load(run.run_dir / ABLATION)
    if not ablation.is_grid:
        return None
    picked = choose_head(
        ablation,
        DepositReport.load(run.run_dir / DEPOSITS),
        run.task.name,
        run.model.cfg.encoding_kind,
    )
    if picked is None:
        return None
    layer, head, why = picked
    model, test = run.model, run.test_set(ATTENTION_EXAMPLES)
    H = model.cfg.n_heads
    drops = np.nan_to_num(ablation.drops[layer], nan=-np.inf)
    others = sorted((h for h in range(H) if h != head), key=lambda h: -drops[h])
    examples = []
    for i in range(len(test)):
        n = int(test.pad_mask[i].sum()) if model.cfg.mask_padding else test.tokens.shape[1]
        shown = [head] + (others if H * n * n <= MAX_WEIGHTS else others[:3])
        examples.append(
            attention_patterns(
                model,
                test.tokens,
                [(layer, h) for h in shown],
                example=i,
                pad_mask=test.pad_mask,
                task=run.task,
                labels=test.labels,
                decimals=DECIMALS,
            )
        )
    record = AttentionRecord(layer, head, why, tuple(examples))
    save_result(run.run_dir / ATTENTION, record, run.provenance, indent=None)
    return {"file": ATTENTION, "layer": layer, "head": head, "why": why}

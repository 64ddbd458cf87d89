"""Attention patterns of chosen heads on one example, as a result that saves and loads itself
(what :func:`probes.heads.view.attention_html` draws, and what a sweep stores for the report)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.util.io import (
    load_result,
    nan_array,
    register_result,
    to_json,
    write_result,
)
from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    check_example,
    check_examples,
    check_finite_model,
    check_heads,
    takes_probe_model,
)

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

Head = tuple[int, int]

__all__ = ["AttentionPatterns", "attention_patterns", "token_labels"]

PAD_LABEL = "·"


def token_labels(
    tokens: Tensor, pad_mask: Tensor | None = None, task: Any = None, pad_id: int = 0
) -> list[str]:
    """Readable labels for one row of token ids: ``"<id>"``, triggers of ``task`` (an object with a
    ``triggers`` tuple) as ``"T<k>:<id>"``, pads as ``"·"``. Labels are made unique with a
    position suffix because circuitsvis keys tokens by text."""
    ids = [int(t) for t in tokens.tolist()]
    real = [i != pad_id for i in ids] if pad_mask is None else [bool(m) for m in pad_mask.tolist()]
    triggers = tuple(getattr(task, "triggers", ()) or ())
    out = []
    for pos, (i, r) in enumerate(zip(ids, real)):
        if not r:
            label = PAD_LABEL
        elif i in triggers:
            label = f"T{triggers.index(i) + 1}:{i}" if len(triggers) <= 4 else f"T:{i}"
        else:
            label = str(i)
        out.append(f"{label}@{pos}")
    return out


RESULT_KIND = register_result(
    "attention patterns", "AttentionPatterns.load", ("heads", "pattern", "tokens")
)


@dataclass(frozen=True, eq=False)
class AttentionPatterns:
    """``pattern [len(heads), n, n]``: each of ``heads``' attention (query rows, key columns) on
    row ``example`` of the input, over its first ``n`` positions (its real tokens when padding
    was cropped); ``tokens`` are their labels and ``label`` the example's task-level label value
    when known."""

    heads: tuple[Head, ...]
    pattern: np.ndarray
    tokens: tuple[str, ...]
    example: int = 0
    label: int | None = None

    @property
    def n(self) -> int:
        return int(self.pattern.shape[-1])

    def head(self, layer: int, head: int) -> np.ndarray:
        """The ``[n, n]`` pattern of one of :attr:`heads`."""
        return self.pattern[self.heads.index((layer, head))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": [list(h) for h in self.heads],
            "pattern": to_json(self.pattern),
            "tokens": list(self.tokens),
            "example": self.example,
            "label": self.label,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttentionPatterns:
        return cls(
            heads=tuple((int(a), int(b)) for a, b in d["heads"]),
            pattern=nan_array(d["pattern"]),
            tokens=tuple(d["tokens"]),
            example=int(d.get("example", 0)),
            label=None if d.get("label") is None else int(d["label"]),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | Path) -> AttentionPatterns:
        return load_result(path, RESULT_KIND, cls.from_dict)


@takes_probe_model
def attention_patterns(
    model: ProbeModel,
    tokens: Tensor,
    heads: Sequence[Head],
    *,
    example: int = 0,
    pad_mask: Tensor | None = None,
    labels: Tensor | None = None,
    task: Any = None,
    token_names: Sequence[str] | None = None,
    crop_padding: bool = True,
    decimals: int | None = None,
) -> AttentionPatterns:
    """The attention patterns (``blocks.{l}.attn.hook_pattern``) of ``heads`` on row ``example``
    of ``tokens``, in eval mode. Right padding is cropped unless ``crop_padding=False``.
    ``labels`` (class indices) and ``task`` give the example's label value; ``task`` also names
    its triggers in the token labels. ``decimals`` rounds the weights (to keep stored files
    small)."""
    who = "attention_patterns"
    if heads is None or not len(heads):
        raise ValueError(f"{who}: no heads given; pass (layer, head) pairs such as [(0, 0)]")
    heads = tuple(check_heads(model, heads, who))
    check_finite_model(model, who)
    if isinstance(tokens, Tensor) and tokens.ndim == 1:
        tokens = tokens[None]
        pad_mask = (
            pad_mask[None] if isinstance(pad_mask, Tensor) and pad_mask.ndim == 1 else pad_mask
        )
    tokens, labels, full_pm = check_examples(model, tokens, labels, pad_mask, who=who)
    example = check_example(example, tokens.shape[0], who)
    row = tokens[example : example + 1]
    pm = None if pad_mask is None else full_pm[example : example + 1]
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in sorted({layer for layer, _ in heads})]
    with eval_mode(model), torch.no_grad():
        _, cache = model.run_with_cache(row, pm, names_filter=names)
    pattern = torch.stack(
        [cache[f"blocks.{layer}.attn.hook_pattern"][0, h] for layer, h in heads]
    )  # [H, q, k]
    n = row.shape[1]
    if crop_padding:
        real = (row[0] != model.cfg.pad_id) if pm is None else pm[0]
        k = int(real.sum())
        if k > 0 and bool(real[:k].all()):  # right-padded: keep the real prefix
            n = k
    if token_names is None:
        token_names = token_labels(row[0], None if pm is None else pm[0], task, model.cfg.pad_id)
    out = pattern[:, :n, :n].double().cpu().numpy()
    if decimals is not None:
        out = out.round(decimals)
    label = None
    if labels is not None:
        label = int(labels[example])
        if task is not None and hasattr(task, "label_values"):
            label = int(task.label_values[label])
    return AttentionPatterns(heads, out, tuple(list(token_names)[:n]), int(example), label)

"""Positional head types, named and scored: previous-token, duplicate-token, induction and
first-token (attention sink) heads, every layer's heads at once, on batches of token rows.

For one prompt (its real tokens ``t_0 .. t_{n-1}``), query ``q`` of a head reads its **targets**:

- ``previous_token``: ``k = q - 1``;
- ``duplicate_token``: ``k < q`` with ``t_k = t_q`` (an earlier copy of the query's token);
- ``induction``: ``1 <= k <= q`` with ``t_{k-1} = t_q`` (the token after an earlier copy);
- ``first_token``: ``k = 0`` (the attention sink of Gu et al. 2024, "When Attention Sink Emerges
  in Language Models").

The first three are TransformerLens' detection patterns (``transformer_lens.head_detector``:
``get_previous_token_head_detection_pattern`` and its siblings, ``k = q`` included for induction
where ``t_{q-1} = t_q``, as there). Three numbers per head and type, ``[n_layers, n_heads]``:

- ``scores``: for the first three, ``detect_head``'s default score (``error_measure="mul"``): per
  prompt, the attention on targets over all the attention of the prompt's real (query, key)
  pairs (with ``exclude_bos`` key 0 and with ``exclude_current_token`` the diagonal left out of
  both), then the plain mean over prompts, as ``detect_head`` averages a list of prompts. For
  ``first_token``, Gu et al.'s score: the mean over real queries of the attention to the first
  token (the same number where rows sum to 1 over real keys; the exclusions do not apply).
- ``focus``: per prompt, the mean over the queries that have a target of the attention on their
  targets, then the mean over the prompts that have such a query (NaN where none has). For
  induction on repeated random tokens this is the prefix-matching score (Olsson et al. 2022).
  A ``"mul"`` score is capped by the prompts (a perfect induction head scores the share of
  queries that have a target, ``coverage``); focus is not, so heads are typed on it.
- ``coverage`` (one number per type): the mean share of a prompt's real queries that have a
  target (with the default measure, the score of a head that puts all of its attention on them).

A head is of type X when ``focus[X] >= thresholds[X]`` (:data:`DEFAULT_THRESHOLDS`, recorded
in the result). Padded queries and keys are left out (right padding, as every model here pads).
The scoring of ``n`` rows costs ``ceil(n / batch_size)`` forwards, each with one hook on every
layer's ``hook_pattern``, stopped once the last layer's pattern is read.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pe_interp.models.protocol import HOOKS, ProbeModel
from pe_interp.util.io import load_result, nan_array, register_result, write_result
from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    check_count,
    check_examples,
    check_finite_model,
    check_fraction,
    takes_probe_model,
)

__all__ = [
    "DEFAULT_THRESHOLDS",
    "HEAD_TYPES",
    "TL_HEAD_NAMES",
    "HeadTypeScores",
    "head_type_scores",
]

HEAD_TYPES: tuple[str, ...] = ("previous_token", "duplicate_token", "induction", "first_token")
TL_HEAD_NAMES: dict[str, str] = {  # the TransformerLens detect_head pattern of each type
    "previous_token": "previous_token_head",
    "duplicate_token": "duplicate_token_head",
    "induction": "induction_head",
}
DEFAULT_THRESHOLDS: dict[str, float] = {
    # a previous-token head gives most of its attention to the previous token
    "previous_token": 0.5,
    # Gu et al.'s epsilon for the sink; the same bar for the content-matching types
    "duplicate_token": 0.3,
    "induction": 0.3,
    "first_token": 0.3,
}
DEFINITION = (
    "score: TransformerLens detect_head (mul) per prompt, mean over prompts; first_token: mean "
    "attention to the first token (Gu et al. 2024); focus: mean attention on targets over the "
    "queries that have one; a head is of a type when focus >= threshold"
)
RESULT_KIND = register_result(
    "head types", "HeadTypeScores.load", ("scores", "focus", "coverage", "thresholds")
)


@dataclass(frozen=True, eq=False)
class HeadTypeScores:
    """What :func:`head_type_scores` returns (module docstring): per type in
    :data:`HEAD_TYPES`, ``scores`` and ``focus`` ``[n_layers, n_heads]`` (float64), the prompts'
    ``coverage`` and the ``thresholds`` that type a head."""

    scores: dict[str, Tensor]
    focus: dict[str, Tensor]
    coverage: dict[str, float]
    thresholds: dict[str, float]
    n_examples: int
    n_forwards: int
    batch_size: int
    exclude_bos: bool = False
    exclude_current_token: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.scores[HEAD_TYPES[0]].shape)

    @property
    def previous_token(self) -> Tensor:
        return self.scores["previous_token"]

    @property
    def duplicate_token(self) -> Tensor:
        return self.scores["duplicate_token"]

    @property
    def induction(self) -> Tensor:
        return self.scores["induction"]

    @property
    def first_token(self) -> Tensor:
        return self.scores["first_token"]

    def is_type(self, kind: str) -> Tensor:
        """``[n_layers, n_heads]`` bool: the heads of type ``kind`` (focus >= its threshold)."""
        return torch.nan_to_num(self.focus[_kind(kind)], nan=-math.inf) >= self.thresholds[kind]

    def top(self, kind: str, k: int = 5, by: str = "score") -> list[tuple[tuple[int, int], float]]:
        """The ``k`` heads with the highest ``by`` (``"score"`` or ``"focus"``) of type ``kind``, as
        ``((layer, head), value)``, highest first (NaN last)."""
        if by not in ("score", "focus"):
            raise ValueError(f"by must be 'score' or 'focus', got {by!r}")
        values = (self.scores if by == "score" else self.focus)[_kind(kind)]
        flat = values.flatten()
        order = torch.nan_to_num(flat, nan=-math.inf).argsort(descending=True, stable=True)
        n_heads = values.shape[1]
        return [(divmod(i, n_heads), float(flat[i])) for i in order[: max(0, k)].tolist()]

    def types(self) -> dict[str, list[tuple[int, int]]]:
        """Each type's heads (focus >= its threshold), highest focus first."""
        return {kind: self._typed(kind) for kind in HEAD_TYPES}

    def _typed(self, kind: str) -> list[tuple[int, int]]:
        typed = self.is_type(kind)
        return [lh for lh, _ in self.top(kind, typed.numel(), by="focus") if bool(typed[lh])]

    def kinds_of(self, layer: int, head: int) -> list[str]:
        """The types of head ``(layer, head)``."""
        return [kind for kind in HEAD_TYPES if bool(self.is_type(kind)[layer, head])]

    def summary(self, k: int = 5) -> str:
        """A few lines: per type, the threshold, coverage, how many heads are of the type, and the
        top ``k`` heads by score (focus in brackets)."""
        n_layers, n_heads = self.shape
        lines = [
            f"head types of {n_layers}x{n_heads} heads on {self.n_examples} prompts "
            f"({self.n_forwards} forwards of <= {self.batch_size})"
        ]
        for kind in HEAD_TYPES:
            typed = self._typed(kind)
            heads = ", ".join(
                f"L{lh[0]}H{lh[1]} {v:.3f} [{float(self.focus[kind][lh]):.3f}]"
                for lh, v in self.top(kind, k)
            )
            lines.append(
                f"{kind}: {len(typed)} head(s) with focus >= {self.thresholds[kind]:g} "
                f"(coverage {self.coverage[kind]:.3f}); top: {heads}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scores": {k: v.tolist() for k, v in self.scores.items()},
            "focus": {k: v.tolist() for k, v in self.focus.items()},
            "coverage": dict(self.coverage),
            "thresholds": dict(self.thresholds),
            "types": {k: [list(lh) for lh in v] for k, v in self.types().items()},
            "n_examples": self.n_examples,
            "n_forwards": self.n_forwards,
            "batch_size": self.batch_size,
            "exclude_bos": self.exclude_bos,
            "exclude_current_token": self.exclude_current_token,
            "error_measure": "mul",
            "definition": DEFINITION,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadTypeScores:
        def arrays(x: dict[str, Any]) -> dict[str, Tensor]:
            return {k: torch.from_numpy(nan_array(x[k])) for k in HEAD_TYPES}

        return cls(
            scores=arrays(d["scores"]),
            focus=arrays(d["focus"]),
            coverage={k: float(d["coverage"][k]) for k in HEAD_TYPES},
            thresholds={k: float(d["thresholds"][k]) for k in HEAD_TYPES},
            n_examples=int(d["n_examples"]),
            n_forwards=int(d["n_forwards"]),
            batch_size=int(d["batch_size"]),
            exclude_bos=bool(d.get("exclude_bos", False)),
            exclude_current_token=bool(d.get("exclude_current_token", False)),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> HeadTypeScores:
        return load_result(path, RESULT_KIND, cls.from_dict)


def _kind(kind: str) -> str:
    if kind not in HEAD_TYPES:
        raise ValueError(f"head type must be one of {', '.join(HEAD_TYPES)}; got {kind!r}")
    return kind


class _Done(Exception):
    """Raised by the last layer's pattern hook: the rest of the forward is not needed."""


@takes_probe_model
def head_type_scores(
    model: ProbeModel,
    tokens: Tensor,
    pad_mask: Tensor | None = None,
    *,
    batch_size: int = 16,
    thresholds: Mapping[str, float] | None = None,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    progress: bool = False,
) -> HeadTypeScores:
    """:class:`HeadTypeScores` of every head on ``tokens [n, pos]`` (right-padded; ``pad_mask``
    default ``tokens != cfg.pad_id``), ``ceil(n / batch_size)`` forwards. ``thresholds``
    overrides :data:`DEFAULT_THRESHOLDS` per type; ``exclude_bos``/``exclude_current_token`` as in
    TransformerLens' ``detect_head``; ``progress``: a tqdm bar of the batches."""
    who = "head_type_scores"
    check_count(batch_size, "batch_size", 1, who)
    bars = dict(DEFAULT_THRESHOLDS)
    for kind, value in (thresholds or {}).items():
        if kind not in HEAD_TYPES:
            raise ValueError(f"{who}: thresholds: no head type {kind!r} ({', '.join(HEAD_TYPES)})")
        bars[kind] = check_fraction(value, f"thresholds[{kind!r}]", who, zero=True)
    check_finite_model(model, who)
    tokens, _, pad_mask = check_examples(model, tokens, None, pad_mask, who=who)
    if bool((pad_mask[:, 1:] & ~pad_mask[:, :-1]).any()):
        row = int((pad_mask[:, 1:] & ~pad_mask[:, :-1]).any(1).nonzero()[0])
        raise ValueError(
            f"{who}: pad_mask: row {row} has a real token after a pad; pad on the right"
        )
    cfg, n = model.cfg, tokens.shape[0]
    sums = _Sums(cfg.n_layers, cfg.n_heads, exclude_bos, exclude_current_token, tokens.device)
    starts = range(0, n, batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="head types", unit="batch")
    hooks = [
        (HOOKS.attn(layer, "pattern"), functools.partial(sums.read, layer=layer))
        for layer in range(cfg.n_layers)
    ]
    with eval_mode(model), torch.no_grad():
        for start in starts:
            valid = pad_mask[start : start + batch_size]
            # pads reach no real token where the model masks them: cut the batch to its longest row
            width = int(valid.sum(1).max()) if cfg.mask_padding else valid.shape[1]
            valid, toks = valid[:, :width], tokens[start : start + batch_size, :width]
            key_valid = model.check_inputs(toks, valid)[1]
            sums.start_batch(toks, valid)
            with model.hooks(fwd_hooks=hooks), contextlib.suppress(_Done):
                model.forward_unchecked(toks, key_valid)  # stops after the last layer's pattern
    return sums.result(
        n_examples=n,
        n_forwards=len(range(0, n, batch_size)),
        batch_size=batch_size,
        thresholds=bars,
        exclude_bos=bool(exclude_bos),
        exclude_current_token=bool(exclude_current_token),
    )


class _Sums:
    """The sums over prompts, batch by batch: :meth:`start_batch` reads a batch's tokens, then
    :meth:`read` each layer's ``hook_pattern`` in the forward (the last one raises :class:`_Done`)."""

    def __init__(self, n_layers: int, n_heads: int, no_bos: bool, no_current: bool, device) -> None:
        f64 = torch.float64
        self.n_layers, self.no_bos, self.no_current = n_layers, no_bos, no_current
        self.score = torch.zeros(len(HEAD_TYPES), n_layers, n_heads, dtype=f64, device=device)
        self.focus = torch.zeros_like(self.score)
        self.focus_n = torch.zeros(len(HEAD_TYPES), dtype=f64, device=device)  # prompts with one
        self.cover = torch.zeros(len(HEAD_TYPES), dtype=f64, device=device)

    def start_batch(self, tokens: Tensor, valid: Tensor) -> None:
        self.targets = _targets(tokens, valid)  # [b, type, q, k] float64
        self.has = self.targets.amax(-1)  # [b, type, q]: the query has a target
        self.n_has = self.has.sum(-1)  # [b, type]
        self.n_real = valid.sum(1, keepdim=True).to(torch.float64)  # [b, 1]
        self.cover += (self.n_has / self.n_real).sum(0)
        self.focus_n += (self.n_has > 0).sum(0)
        self.pair = (valid[:, :, None] & valid[:, None, :]).to(torch.float64)[:, None]  # [b,1,q,k]
        self.kept = None  # detect_head's exclusions: key 0, the diagonal
        if self.no_bos or self.no_current:
            self.kept = self.pair.clone()
            if self.no_bos:
                self.kept[..., 0] = 0
            if self.no_current:
                self.kept.diagonal(dim1=-2, dim2=-1).zero_()

    def read(self, pattern: Tensor, hook: Any, layer: int) -> None:
        a = pattern.to(torch.float64) * self.pair  # [b, h, q, k]: real queries and keys only
        on = torch.einsum("bhqk,btqk->bthq", a, self.targets)  # attention on targets, per query
        focus = (on * self.has[:, :, None]).sum(-1) / self.n_has.clamp(min=1)[:, :, None]
        self.focus[:, layer] += focus.sum(0)  # a prompt without a target query adds 0
        am = a if self.kept is None else a * self.kept
        tl = torch.einsum("bhqk,btqk->bth", am, self.targets[:, :3]) / am.sum((-2, -1))[:, None]
        sink = on[:, 3].sum(-1) / self.n_real  # [b, h]: mean over real queries
        self.score[:, layer] += torch.cat([tl, sink[:, None]], 1).sum(0)
        if layer == self.n_layers - 1:
            raise _Done

    def result(self, n_examples: int, **fields: Any) -> HeadTypeScores:
        focus = torch.where(
            self.focus_n[:, None, None] > 0,
            self.focus / self.focus_n.clamp(min=1)[:, None, None],
            torch.full_like(self.focus, math.nan),
        )
        return HeadTypeScores(
            scores={k: (self.score[i] / n_examples).cpu() for i, k in enumerate(HEAD_TYPES)},
            focus={k: focus[i].cpu() for i, k in enumerate(HEAD_TYPES)},
            coverage={k: float(self.cover[i] / n_examples) for i, k in enumerate(HEAD_TYPES)},
            n_examples=n_examples,
            **fields,
        )


def _targets(tokens: Tensor, valid: Tensor) -> Tensor:
    """``[b, type, q, k]`` float64: 1 where key ``k`` is a target of query ``q`` (module
    docstring), real queries and keys only, in the order of :data:`HEAD_TYPES`."""
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    q, k = pos[:, None], pos[None, :]  # [q, 1], [1, k]
    shifted = torch.cat([tokens[:, :1], tokens[:, :-1]], 1)  # t_{k-1} at k (k = 0: unused)
    out = torch.stack(
        [
            (k == q - 1).expand(tokens.shape[0], -1, -1),
            (tokens[:, :, None] == tokens[:, None, :]) & (k < q),
            (tokens[:, :, None] == shifted[:, None, :]) & (k >= 1) & (k <= q),
            (k == 0).expand(tokens.shape[0], tokens.shape[1], -1),
        ],
        1,
    )
    return (out & (valid[:, :, None] & valid[:, None, :])[:, None]).to(torch.float64)

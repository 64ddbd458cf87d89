"""Prompt sets in natural tokens, shaped as the probes read a batch.

A :class:`PromptSet` holds right-padded token ids (``pad_id``: the tokenizer's pad token, else a
fallback recorded in ``pad_source``, :func:`pe_interp.prompts.vocab.pad_choice`), a ``pad_mask``
(True at real tokens), one label per row (the answer's FIRST token id: a label is a class of
``BridgedModel(bridge)``, whose classes are the vocabulary), the answer strings and how many
tokens each has (an answer of more tokens is scored on its first), the BOS policy used and the
family's name. :class:`PromptPairs` are clean/corrupt sets aligned position by position, as
``task.counterfactuals`` gives them: ``pairs.clean.tokens``, ``pairs.corrupt.labels``, ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from pe_interp.prompts.vocab import BosPolicy, pad_choice
from pe_interp.tasks.batch import Batch, CounterfactualPairs

PAIR_KINDS = ("position", "content")


@dataclass(frozen=True, eq=False)
class PromptSet:
    """Prompts of one family (module docstring); built by :func:`assemble`, checked on construction."""

    family: str
    tokens: Tensor  # [n, pos] int64, right-padded with pad_id
    labels: Tensor  # [n] int64: each answer's first token id
    pad_mask: Tensor  # [n, pos] bool, True at real tokens
    answers: tuple[str, ...]
    answer_lengths: tuple[int, ...]  # tokens in each answer; > 1: scored on its first token
    bos: BosPolicy
    pad_id: int
    pad_source: str = ""
    texts: tuple[str, ...] = field(default=(), repr=False)  # each prompt decoded (no BOS)

    def __post_init__(self) -> None:
        n = self.tokens.shape[0] if self.tokens.dim() == 2 else -1
        if n < 0 or self.tokens.dtype != torch.long:
            raise ValueError(f"{self.family}: tokens must be a 2-D int64 tensor")
        if self.pad_mask.shape != self.tokens.shape or self.pad_mask.dtype != torch.bool:
            raise ValueError(f"{self.family}: pad_mask must be a bool tensor shaped like tokens")
        if self.labels.shape != (n,) or len(self.answers) != n or len(self.answer_lengths) != n:
            raise ValueError(f"{self.family}: one label, answer and answer length per prompt")
        mask = self.pad_mask
        if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            row = int((mask[:, 1:] & ~mask[:, :-1]).any(1).nonzero()[0])
            raise ValueError(
                f"{self.family}: row {row} is padded on the left (a real token follows a pad); "
                "prompts are right-padded"
            )
        if n and not bool(mask.any(1).all()):
            raise ValueError(f"{self.family}: row {int((~mask.any(1)).nonzero()[0])} is empty")
        if bool((self.tokens[~mask] != self.pad_id).any()):
            raise ValueError(f"{self.family}: a pad position holds an id other than {self.pad_id}")
        if bool((self.tokens[mask] == self.pad_id).any()):
            row = int(((self.tokens == self.pad_id) & mask).any(1).nonzero()[0])
            raise ValueError(
                f"{self.family}: row {row} holds the pad id {self.pad_id} as a real token"
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: slice | Sequence[int] | Tensor) -> PromptSet:
        """The prompts selected by a slice, a list of row indices or an index / bool tensor."""
        rows = list(range(len(self)))[index] if isinstance(index, slice) else None
        if rows is None:
            idx = torch.as_tensor(index)
            rows = idx.nonzero().flatten().tolist() if idx.dtype == torch.bool else idx.tolist()
        keep = torch.as_tensor(rows, dtype=torch.long)
        return PromptSet(
            self.family,
            self.tokens[keep],
            self.labels[keep],
            self.pad_mask[keep],
            tuple(self.answers[i] for i in rows),
            tuple(self.answer_lengths[i] for i in rows),
            self.bos,
            self.pad_id,
            self.pad_source,
            tuple(self.texts[i] for i in rows) if self.texts else (),
        )

    @property
    def lengths(self) -> Tensor:
        """The number of real tokens in each prompt, ``[n]``."""
        return self.pad_mask.sum(1)

    @property
    def n_multi_token(self) -> int:
        """How many answers have more than one token (each is scored on its first)."""
        return sum(1 for k in self.answer_lengths if k > 1)

    @property
    def batch(self) -> Batch:
        """The prompts as a task :class:`~pe_interp.tasks.Batch` (tokens, labels, pad_mask)."""
        return Batch(self.tokens, self.labels, self.pad_mask)

    def to(self, device: torch.device | str) -> PromptSet:
        """The same prompts with their tensors on ``device``."""
        return PromptSet(
            self.family,
            self.tokens.to(device),
            self.labels.to(device),
            self.pad_mask.to(device),
            self.answers,
            self.answer_lengths,
            self.bos,
            self.pad_id,
            self.pad_source,
            self.texts,
        )

    def describe(self) -> str:
        """One line: the family, the number of prompts, the BOS policy, the pad id, multi-token answers."""
        multi = (
            f"; {self.n_multi_token} of {len(self)} answers are multi-token, scored on their first token"
            if self.n_multi_token
            else ""
        )
        return (
            f"{self.family}: {len(self)} prompts of {int(self.lengths.min()) if len(self) else 0}-"
            f"{int(self.lengths.max()) if len(self) else 0} tokens; {self.bos.describe()}; "
            f"pad id {self.pad_id} ({self.pad_source}){multi}"
        )


@dataclass(frozen=True, eq=False)
class PromptPairs:
    """Clean/corrupt prompt sets, row ``i`` of each one pair with one ``pad_mask``. ``kind``:
    ``"position"`` (each corrupt row holds its clean row's tokens moved, the answer changed) or
    ``"content"`` (the same positions, tokens changed, the answer changed)."""

    clean: PromptSet
    corrupt: PromptSet
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in PAIR_KINDS:
            raise ValueError(f"kind must be one of {PAIR_KINDS}, got {self.kind!r}")
        if self.clean.tokens.shape != self.corrupt.tokens.shape or not torch.equal(
            self.clean.pad_mask, self.corrupt.pad_mask
        ):
            raise ValueError(
                f"{self.clean.family}: clean and corrupt prompts must line up (one shape, one pad_mask)"
            )
        if self.clean.pad_id != self.corrupt.pad_id:
            raise ValueError(f"{self.clean.family}: clean and corrupt use different pad ids")

    def __len__(self) -> int:
        return len(self.clean)

    def __getitem__(self, index: slice | Sequence[int] | Tensor) -> PromptPairs:
        """The pairs selected by ``index`` (as :meth:`PromptSet.__getitem__`)."""
        return PromptPairs(self.clean[index], self.corrupt[index], self.kind)

    @property
    def pad_mask(self) -> Tensor:
        """The pad mask both sides share, ``[n, pos]``."""
        return self.clean.pad_mask

    @property
    def changed(self) -> Tensor:
        """Positions where the corrupt tokens differ from the clean ones, ``[n, pos]`` bool."""
        return self.clean.tokens != self.corrupt.tokens

    @property
    def counterfactual_pairs(self) -> CounterfactualPairs:
        """The pairs as the synthetic tasks' :class:`~pe_interp.tasks.CounterfactualPairs`."""
        return CounterfactualPairs(self.clean.batch, self.corrupt.batch)

    def to(self, device: torch.device | str) -> PromptPairs:
        """The same pairs on ``device``."""
        return PromptPairs(self.clean.to(device), self.corrupt.to(device), self.kind)


def assemble(
    family: str,
    tokenizer: Any,
    rows: list[list[int]],
    answer_ids: list[list[int]],
    answers: list[str] | None,
    bos: BosPolicy,
    pad: tuple[int, str] | None = None,
) -> PromptSet:
    """A :class:`PromptSet` of ``rows`` (token ids, BOS not yet prepended) answered by
    ``answer_ids`` (each answer's tokens; the label is the first), right-padded with ``pad``
    (default :func:`~pe_interp.prompts.vocab.pad_choice`). ``answers``: the answer strings
    (default: each answer's tokens decoded)."""
    if any(not ids for ids in answer_ids):
        raise ValueError(f"{family}: an answer has no tokens")
    texts = tuple(tokenizer.decode(r) for r in rows)
    head = [bos.token_id] if bos.prepended and bos.token_id is not None else []
    full = [head + list(r) for r in rows]
    pad_id, pad_source = pad_choice(tokenizer, full) if pad is None else pad
    width = max((len(r) for r in full), default=1)
    tokens = torch.full((len(full), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(full), width), dtype=torch.bool)
    for i, r in enumerate(full):
        tokens[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    if answers is None:
        answers = [tokenizer.decode(ids) for ids in answer_ids]
    return PromptSet(
        family=family,
        tokens=tokens,
        labels=torch.as_tensor([ids[0] for ids in answer_ids], dtype=torch.long),
        pad_mask=mask,
        answers=tuple(answers),
        answer_lengths=tuple(len(ids) for ids in answer_ids),
        bos=bos,
        pad_id=pad_id,
        pad_source=pad_source,
        texts=texts,
    )


def assemble_pairs(
    family: str,
    tokenizer: Any,
    clean: tuple[list[list[int]], list[list[int]], list[str] | None],
    corrupt: tuple[list[list[int]], list[list[int]], list[str] | None],
    bos: BosPolicy,
    kind: str,
) -> PromptPairs:
    """:class:`PromptPairs` of clean and corrupt ``(rows, answer ids, answer strings)`` (as
    :func:`assemble`), padded with one pad id chosen over both sides."""
    head = [bos.token_id] if bos.prepended and bos.token_id is not None else []
    pad = pad_choice(tokenizer, [head + r for r in clean[0] + corrupt[0]])
    return PromptPairs(
        assemble(family, tokenizer, *clean, bos, pad),
        assemble(family, tokenizer, *corrupt, bos, pad),
        kind,
    )


__all__ = ["PAIR_KINDS", "PromptPairs", "PromptSet", "assemble", "assemble_pairs"]

"""Positional prompt families for pretrained models, in natural tokens, any Hugging Face tokenizer.

Each family lays out a list of distinct single-token items and asks for the item in one slot:

- :class:`Induction` (Olsson et al. 2022): BOS, ``n_random`` random tokens, then the first
  ``n_repeat`` of them again; the answer is token ``n_repeat + 1`` of the first copy.
- :class:`RecallByIndex`: ``"List: apple, dog, cat. The third item in the list is"`` → ``" cat"``.
- :class:`Successor`: ``"List: apple, dog, cat. In the list, after dog comes"`` → ``" cat"``: the
  answer is fixed by order alone (the query names a token, not a position).

The list families put ``shots`` worked examples (default 1: other items, the question answered)
before the list, the same in a clean row and its counterfactuals.

Items come from a seeded pool (``pool``): ``"words"``, the common nouns the tokenizer encodes as
one space-prefixed token (:func:`~pe_interp.prompts.vocab.word_pool`); ``"ids"``, every id but
the special tokens (:func:`~pe_interp.prompts.vocab.id_pool`); ``"auto"``, words where enough
are single tokens, else ids. Prompts are built by concatenating token ids (the template's pieces
encoded once each), so a corrupt row is exactly its clean row's tokens moved.

Counterfactuals (:meth:`PromptFamily.counterfactuals`; the clean rows are ``sample(n, seed)``):

- ``"position"``: the answer item swapped with another item of the list, the question unchanged:
  every row the same multiset of tokens, the answer another item (two positions change).
- ``"content"``: the answer item replaced by an item in no slot of the row: the same positions,
  the answer that new item (one position changes: the answer slot is never repeated or named).

Each family names the spans of its layout (``span_names``, ``spans(batch)``;
:mod:`pe_interp.prompts.spans`), which position-aware circuits keep edges at.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from pe_interp.prompts.batch import PAIR_KINDS, PromptPairs, PromptSet, assemble, assemble_pairs
from pe_interp.prompts.spans import (
    INDUCTION_SPANS,
    RECALL_SPANS,
    SUCCESSOR_SPANS,
    induction_spans,
    list_spans,
)
from pe_interp.prompts.vocab import BosPolicy, bos_policy, encode, id_pool, word_pool
from pe_interp.prompts.words import ORDINALS
from pe_interp.tasks.base import check_int, derive_seed

POOLS = ("auto", "words", "ids")
MIN_WORD_POOL = 32  # "auto" takes the word pool where at least this many words are single tokens

# one example: the items in their slots, the answer's slot, what the question names, and the
# worked examples before it (token ids, the same in a clean row and its counterfactual)
Example = tuple[list[int], int, int, list[int]]


def _randint(gen: torch.Generator, high: int) -> int:
    return int(torch.randint(high, (1,), generator=gen))


@dataclass(frozen=True)
class PromptFamily(ABC):
    """A seeded family of prompts (module docstring). ``tokenizer``: any Hugging Face tokenizer;
    ``bos``: ``"auto"`` (prepend the tokenizer's BOS where it has one), True or False."""

    name: ClassVar[str]
    tokenizer: Any = field(repr=False, compare=False)

    # ----------------------------------------------------------------- what a family supplies
    @property
    @abstractmethod
    def n_items(self) -> int:
        """How many items a prompt lists."""

    @abstractmethod
    def _question(self, gen: torch.Generator, items: list[int]) -> tuple[int, int]:
        """``(answer slot, what the question names)`` for a row of ``items``."""

    @abstractmethod
    def _render(self, items: list[int], asked: int) -> list[int]:
        """The prompt's token ids (no BOS) for ``items`` and the question's ``asked``."""

    @abstractmethod
    def _partners(self, slot: int, asked: int) -> list[int]:
        """The slots a position counterfactual may swap the answer slot with."""

    @abstractmethod
    def _check(self) -> None:
        """Raise a one-line ValueError where the family's fields cannot make a prompt."""

    span_names: ClassVar[tuple[str, ...]]

    @abstractmethod
    def spans(self, batch: Any) -> Tensor:
        """Each position's index into :attr:`span_names`, ``[batch, pos]``, for rows of the family
        (a :class:`~pe_interp.tasks.Batch`; :mod:`pe_interp.prompts.spans`)."""

    # ----------------------------------------------------------------- shared
    def __post_init__(self) -> None:
        for name in ("pool", "bos"):
            value = getattr(self, name)
            allowed = POOLS if name == "pool" else ("auto", True, False)
            if value not in allowed:
                raise ValueError(
                    f"{type(self).__name__}.{name} must be one of {allowed}, got {value!r}"
                )
        self._check()
        need = self.n_needed
        if len(self.items_pool) < need:
            raise ValueError(
                f"{type(self).__name__}: the tokenizer has only {len(self.items_pool)} "
                f"{self.pool_used} for {need} distinct items; use pool='ids' or fewer items"
            )

    pool: str = "auto"
    bos: bool | str = "auto"

    @property
    def n_needed(self) -> int:
        """How many distinct items the pool must hold: a row's, its worked examples' and one more."""
        return self.n_items + 1

    @cached_property
    def bos_used(self) -> BosPolicy:
        """The BOS policy every prompt of the family follows."""
        return bos_policy(self.tokenizer, self.bos)

    @cached_property
    def _pools(self) -> tuple[list[int], str]:
        if self.pool in ("auto", "words"):
            words = word_pool(self.tokenizer)
            if self.pool == "words" or len(words) >= MIN_WORD_POOL:
                return words, "single-token words"
        return id_pool(self.tokenizer), "token ids (no special tokens)"

    @property
    def items_pool(self) -> list[int]:
        """The token ids items are drawn from, in a fixed order."""
        return self._pools[0]

    @property
    def pool_used(self) -> str:
        """Which pool the items come from, in words."""
        return self._pools[1]

    def generator(self, *parts: object) -> torch.Generator:
        """A CPU generator seeded from the family's name, fields and ``parts``."""
        return torch.Generator().manual_seed(derive_seed(self.name, repr(self), *parts))

    def _draw(self, n: int, seed: int) -> list[Example]:
        gen = self.generator("sample", seed)
        pool = self.items_pool
        out = []
        for _ in range(n):
            pick = torch.randperm(len(pool), generator=gen)[: self.n_items].tolist()
            items = [pool[i] for i in pick]
            slot, asked = self._question(gen, items)
            out.append((items, slot, asked, self._demos(gen, items)))
        return out

    def _demos(self, gen: torch.Generator, items: list[int]) -> list[int]:
        """Worked examples to put before a row of ``items`` (none unless a family has ``shots``)."""
        return []

    def _rows(self, examples: list[Example]) -> tuple[list[list[int]], list[list[int]], None]:
        return (
            [demos + self._render(items, asked) for items, _, asked, demos in examples],
            [[items[slot]] for items, slot, _, _ in examples],
            None,
        )

    def sample(self, n: int, seed: int = 0) -> PromptSet:
        """``n`` prompts, a pure function of (family, ``n``, ``seed``); the first ``m`` rows of
        ``sample(n, seed)`` are ``sample(m, seed)``."""
        check_int(f"{self.name}.sample", "n", n, 1)
        check_int(f"{self.name}.sample", "seed", seed, 0)
        return assemble(self.name, self.tokenizer, *self._rows(self._draw(n, seed)), self.bos_used)

    def counterfactuals(self, n: int, kind: str = "position", seed: int = 0) -> PromptPairs:
        """``n`` clean/corrupt pairs of one kind (module docstring); ``pairs.clean`` holds the
        prompts of ``sample(n, seed)``, and every corrupt label differs from its clean label."""
        check_int(f"{self.name}.counterfactuals", "n", n, 1)
        check_int(f"{self.name}.counterfactuals", "seed", seed, 0)
        if kind not in PAIR_KINDS:
            raise ValueError(
                f"{self.name}.counterfactuals: kind must be one of {PAIR_KINDS}, got {kind!r}"
            )
        clean = self._draw(n, seed)
        gen = self.generator("counterfactuals", kind, seed)
        corrupt = []
        for items, slot, asked, demos in clean:
            items = list(items)
            if kind == "position":
                partners = self._partners(slot, asked)
                j = partners[_randint(gen, len(partners))]
                items[slot], items[j] = items[j], items[slot]
            else:
                items[slot] = self._fresh(gen, items + demos)
            corrupt.append((items, slot, asked, demos))
        return assemble_pairs(
            self.name, self.tokenizer, self._rows(clean), self._rows(corrupt), self.bos_used, kind
        )

    def _fresh(self, gen: torch.Generator, items: list[int]) -> int:
        pool, taken = self.items_pool, set(items)
        while True:
            candidate = pool[_randint(gen, len(pool))]
            if candidate not in taken:
                return candidate

    def describe(self) -> str:
        """One line: the family, its fields, its pool and its BOS policy."""
        return f"{self!r} with items from {len(self.items_pool)} {self.pool_used}; {self.bos_used.describe()}"


@dataclass(frozen=True)
class Induction(PromptFamily):
    """Repeated random tokens: ``n_random`` distinct tokens, then the first ``n_repeat`` again; the
    answer is token ``n_repeat + 1`` of the first copy. A position counterfactual swaps it with a
    later token of the first copy (the repeat stays), so ``n_random >= n_repeat + 2``."""

    name: ClassVar[str] = "induction"
    span_names: ClassVar[tuple[str, ...]] = INDUCTION_SPANS
    n_random: int = 12
    n_repeat: int = 6

    @property
    def n_items(self) -> int:
        return self.n_random

    def _check(self) -> None:
        check_int("Induction", "n_repeat", self.n_repeat, 1)
        check_int("Induction", "n_random", self.n_random, self.n_repeat + 2, why="n_repeat + 2")

    def _question(self, gen: torch.Generator, items: list[int]) -> tuple[int, int]:
        return self.n_repeat, self.n_repeat

    def _render(self, items: list[int], asked: int) -> list[int]:
        return items + items[: self.n_repeat]

    def _partners(self, slot: int, asked: int) -> list[int]:
        return list(range(slot + 1, self.n_random))

    def spans(self, batch: Any) -> Tensor:
        return induction_spans(self, batch)


@dataclass(frozen=True)
class _ListFamily(PromptFamily):
    """A comma-separated list of ``n_list`` items, then a question (:attr:`question`), after
    ``shots`` worked examples (lists of other items, their question answered, then ``".\n"``)."""

    n_list: int = 5
    shots: int = 1
    prefix: ClassVar[str] = "List:"
    separator: ClassVar[str] = ","
    end: ClassVar[str] = "."
    demo_end: ClassVar[str] = ".\n"

    @property
    def n_items(self) -> int:
        return self.n_list

    @property
    def n_needed(self) -> int:
        return self.n_list * (1 + self.shots) + 1

    @cached_property
    def _pieces(self) -> dict[str, list[int]]:
        pieces = (self.prefix, self.separator, self.end, self.demo_end)
        return {p: encode(self.tokenizer, p) for p in pieces}

    def _demos(self, gen: torch.Generator, items: list[int]) -> list[int]:
        out: list[int] = []
        taken = set(items)
        for _ in range(self.shots):
            rest = [t for t in self.items_pool if t not in taken]
            demo = [
                rest[i] for i in torch.randperm(len(rest), generator=gen)[: self.n_list].tolist()
            ]
            slot, asked = self._question(gen, demo)
            out += self._render(demo, asked) + [demo[slot]] + self._pieces[self.demo_end]
            taken.update(demo)
        return out

    def _list(self, items: list[int]) -> list[int]:
        pieces, out = self._pieces, list(self._pieces[self.prefix])
        for i, item in enumerate(items):
            out += ([] if i == 0 else pieces[self.separator]) + [item]
        return out + pieces[self.end]

    @abstractmethod
    def question_lengths(self) -> list[int]:
        """How many tokens each question the family can ask has."""

    def spans(self, batch: Any) -> Tensor:
        return list_spans(self, batch)


@dataclass(frozen=True)
class RecallByIndex(_ListFamily):
    """``"List: apple, dog, cat. The third item in the list is"`` → ``" cat"``: the item at an
    index named by an ordinal (uniform over the list)."""

    name: ClassVar[str] = "recall"
    span_names: ClassVar[tuple[str, ...]] = RECALL_SPANS
    question: ClassVar[str] = " The {ordinal} item in the list is"

    def _check(self) -> None:
        check_int("RecallByIndex", "n_list", self.n_list, 2, len(ORDINALS))
        check_int("RecallByIndex", "shots", self.shots, 0)

    def _question(self, gen: torch.Generator, items: list[int]) -> tuple[int, int]:
        i = _randint(gen, self.n_list)
        return i, i

    @cached_property
    def _questions(self) -> list[list[int]]:
        return [encode(self.tokenizer, self.question.format(ordinal=o)) for o in ORDINALS]

    def _render(self, items: list[int], asked: int) -> list[int]:
        return self._list(items) + self._questions[asked]

    def _partners(self, slot: int, asked: int) -> list[int]:
        return [j for j in range(self.n_list) if j != slot]

    def question_lengths(self) -> list[int]:
        return [len(q) for q in self._questions[: self.n_list]]


@dataclass(frozen=True)
class Successor(_ListFamily):
    """``"List: apple, dog, cat. In the list, after dog comes"`` → ``" cat"``: the item after a
    named one (uniform over all but the last). A position counterfactual swaps the
    answer with an item other than the named one, so ``n_list >= 3``."""

    name: ClassVar[str] = "successor"
    span_names: ClassVar[tuple[str, ...]] = SUCCESSOR_SPANS
    question: ClassVar[tuple[str, str]] = (" In the list, after", " comes")

    def _check(self) -> None:
        check_int("Successor", "n_list", self.n_list, 3)
        check_int("Successor", "shots", self.shots, 0)

    def _question(self, gen: torch.Generator, items: list[int]) -> tuple[int, int]:
        i = _randint(gen, self.n_list - 1)
        return i + 1, items[i]

    @cached_property
    def _around(self) -> tuple[list[int], list[int]]:
        return encode(self.tokenizer, self.question[0]), encode(self.tokenizer, self.question[1])

    def _render(self, items: list[int], asked: int) -> list[int]:
        before, after = self._around
        return self._list(items) + before + [asked] + after

    def _partners(self, slot: int, asked: int) -> list[int]:
        return [j for j in range(self.n_list) if j not in (slot, slot - 1)]

    def question_lengths(self) -> list[int]:
        before, after = self._around
        return [len(before) + 1 + len(after)]


FAMILIES: dict[str, type[PromptFamily]] = {
    "induction": Induction,
    "recall": RecallByIndex,
    "successor": Successor,
}


def make_family(name: str, tokenizer: Any, **fields: Any) -> PromptFamily:
    """The family ``name`` (:data:`FAMILIES`) over ``tokenizer``; a one-line ValueError for an
    unknown name or field."""
    if name not in FAMILIES:
        raise ValueError(f"unknown prompt family {name!r}; expected one of {', '.join(FAMILIES)}")
    try:
        return FAMILIES[name](tokenizer, **fields)
    except TypeError as err:
        raise ValueError(f"bad fields for prompt family {name!r}: {err}") from None


__all__ = [
    "FAMILIES",
    "POOLS",
    "Induction",
    "PromptFamily",
    "RecallByIndex",
    "Successor",
    "make_family",
]

"""Task 3 (position and content together): the token a fixed offset after a marker.

Beyond the paper (issue 23). One marker id is fixed for the whole task; every other id except
``PAD`` is a *value*. A row holds ``left ~ U{1..max_side}`` values, the marker, then
``after ~ U{offset..max_after}`` values; the values of a row are distinct (a uniformly random
ordered sample without replacement). The label is the value ``offset`` positions after the
marker, as a class index into :attr:`RetrieveTask.values`.

Finding the marker is content, and reaching the target is a relative position: a model must
combine the two (a head that looks ``offset`` tokens back for the marker, then a head that copies
the token so marked, for example). Neither alone suffices:

- the label is uniform over the values and independent of the length, so the chance level and
  the length-only ceiling are both exactly ``1 / n_values``;
- a model that sees only which tokens occur (a permutation-invariant model, e.g. NoPE with its
  padding mask) knows that the target is one of the row's ``length - 1`` values, each equally
  likely: its ceiling is ``E[1 / (length - 1)]`` (:meth:`RetrieveTask.content_only_accuracy`).

``extra_left`` / ``extra_right`` add that many values on the left / right of every row
(:meth:`~pe_interp.tasks.base.SyntheticTask.extended`); the marker moves ``extra_left``
positions right, the offset and the classes stay.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import ClassVar

import torch
from jaxtyping import Int
from torch import Tensor

from pe_interp.tasks.base import SyntheticTask, check_int, extend_sides
from pe_interp.tasks.batch import PAD_ID, Batch, CounterfactualPairs

_MAX_REJECTION_ROUNDS = 100


@dataclass(frozen=True)
class RetrieveTask(SyntheticTask):
    """The value ``offset`` tokens after a fixed marker (see the module docstring)."""

    d_vocab: int = 512
    offset: int = 4
    max_side: int = 25
    max_after: int = 94
    max_len: int = 120  # type: ignore[assignment]
    extra_left: int = 0
    extra_right: int = 0
    seed: int = 0

    name: ClassVar[str] = "retrieve"
    jsonl_label_key: ClassVar[str] = "target"
    extensions: ClassVar[tuple[str, ...]] = ("shift", "sides", "right")

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_int(owner, "offset", self.offset, 1)
        check_int(owner, "max_side", self.max_side, 1)
        check_int(owner, "max_after", self.max_after, self.offset, why="the target must exist")
        check_int(owner, "extra_left", self.extra_left, 0)
        check_int(owner, "extra_right", self.extra_right, 0)
        need = self.extra_left + self.max_side + 1 + self.max_after + self.extra_right
        check_int(
            owner,
            "max_len",
            self.max_len,
            need,
            why=f"extra_left + max_side + 1 + max_after + extra_right = {need}, the longest row",
        )
        check_int(
            owner,
            "d_vocab",
            self.d_vocab,
            self.max_len + 2,
            why=f"PAD, the marker and max_len = {self.max_len} distinct values",
        )
        check_int(owner, "seed", self.seed, 0)

    # ----------------------------------------------------------------- vocabulary
    @cached_property
    def marker(self) -> int:
        perm = torch.randperm(self.d_vocab - 1, generator=self.generator("triggers")) + 1
        return int(perm[0])

    @property
    def triggers(self) -> tuple[int]:
        """The special tokens, as the other tasks name theirs (views label them): the marker."""
        return (self.marker,)

    @cached_property
    def values(self) -> Int[Tensor, " n_values"]:
        """The value ids (every id but PAD and the marker), in class order."""
        ids = torch.arange(1, self.d_vocab)
        return ids[ids != self.marker]

    @cached_property
    def _class_of(self) -> Int[Tensor, " d_vocab"]:
        """Class index of each token id (-1 for PAD and the marker)."""
        out = torch.full((self.d_vocab,), -1, dtype=torch.long)
        out[self.values] = torch.arange(len(self.values))
        return out

    @property
    def label_values(self) -> Int[Tensor, " n_classes"]:
        return self.values

    @property
    def n_values(self) -> int:
        return self.d_vocab - 2

    def _extended(self, family: str, extra: int) -> RetrieveTask:
        return extend_sides(self, family, extra)

    # ----------------------------------------------------------------- spans
    span_names: ClassVar[tuple[str, ...]] = (
        "prefix",
        "marker",
        "gap",
        "target",
        "suffix",
        "padding",
    )

    def spans(self, batch: Batch) -> Int[Tensor, "batch pos"]:
        """Each position's part of its example: the values before the marker (``prefix``), the
        ``marker``, the ``offset - 1`` values between it and the ``target``, the target, the values
        after it (``suffix``), pads (``padding``). The marker is found by its id."""
        tokens = batch.tokens
        is_marker = tokens == self.marker
        if not bool((is_marker.sum(1) == 1).all()):
            row = int((is_marker.sum(1) != 1).nonzero()[0, 0])
            raise ValueError(f"{self.name}: row {row} does not hold exactly one marker")
        pos = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        at = is_marker.to(torch.int8).argmax(1)[:, None]
        target = at + self.offset
        out = torch.full_like(tokens, 2)  # gap
        out = torch.where(pos < at, 0, out)
        out = torch.where(pos == at, 1, out)
        out = torch.where(pos == target, 3, out)
        out = torch.where(pos > target, 4, out)
        return torch.where(batch.pad_mask.to(tokens.device), out, 5)

    # ----------------------------------------------------------------- generation
    def _draw_values(
        self, n: int, gen: torch.Generator, exclude: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``[n, max_len]`` distinct value ids per row (uniform ordered samples without
        replacement), avoiding ``exclude [n, d_vocab]`` where given, and how many each row had."""
        keys = torch.rand(n, self.n_values, generator=gen)
        available = torch.full((n,), self.n_values)
        if exclude is not None:
            banned = exclude[:, self.values]
            keys = keys.masked_fill(banned, -1.0)
            available = available - banned.sum(dim=1)
        return self.values[keys.topk(self.max_len, dim=1).indices], available

    def _layout(self, values: Tensor, marker_at: Tensor, length: Tensor) -> Tensor:
        """Rows of ``values`` in order with the marker inserted at ``marker_at``, padded after
        ``length``."""
        pos = torch.arange(self.max_len)[None, :]
        index = (pos - (pos > marker_at[:, None]).long()).clamp(min=0)
        tokens = values.gather(1, index)
        tokens = torch.where(pos == marker_at[:, None], self.marker, tokens)
        return torch.where(pos < length[:, None], tokens, PAD_ID)

    def _labels(self, tokens: Tensor, marker_at: Tensor) -> Tensor:
        return self._class_of[tokens.gather(1, (marker_at + self.offset)[:, None])[:, 0]]

    def _draw(self, n: int, gen: torch.Generator) -> tuple[Batch, Tensor]:
        left = torch.randint(1, self.max_side + 1, (n,), generator=gen) + self.extra_left
        after = (
            torch.randint(self.offset, self.max_after + 1, (n,), generator=gen) + self.extra_right
        )
        length = left + 1 + after
        values, _ = self._draw_values(n, gen)
        tokens = self._layout(values, left, length)
        pad_mask = torch.arange(self.max_len)[None, :] < length[:, None]
        return Batch(tokens, self._labels(tokens, left), pad_mask), left

    def _generate(self, n: int, gen: torch.Generator) -> Batch:
        return self._draw(n, gen)[0]

    def _counterfactual(self, n: int, gen: torch.Generator) -> CounterfactualPairs:
        """The ``"position"`` family of :meth:`counterfactuals`: the marker moved."""
        return self._counterfactual_family(n, "position", gen)

    def _counterfactual_family(
        self, n: int, kind: str, gen: torch.Generator
    ) -> CounterfactualPairs:
        """The three families of :meth:`~pe_interp.tasks.base.SyntheticTask.counterfactuals`.

        Every corrupt row has the clean row's length and ``pad_mask``; here every family changes
        the label (the task needs both where and what).

        - ``"position"``: the same tokens with the marker moved: it swaps with the value at a new
          position, uniform over the other positions the generator could give it at this length
          (left side ``1..max_side`` plus ``extra_left``, at least ``offset`` plus
          ``extra_right`` values after it, at most ``max_after`` plus ``extra_right``). Two
          positions change; the label is the value ``offset`` after the new place, which differs
          from the clean one because a row's values are distinct.
        - ``"content"``: the marker where it was, every value redrawn (distinct, uniformly) from
          the values absent from the clean row, so every value position changes, and with it the
          label.
        - ``"both"``: the new marker place of ``"position"`` with the values of ``"content"``.

        Rows that admit no such corrupt row (one placement only, as with ``max_side=1`` and a
        fixed length; too few unused values, at tiny vocabularies) are redrawn, which conditions
        the clean rows on admitting one.
        """
        cleans, corrupts, have = [], [], 0
        for _ in range(_MAX_REJECTION_ROUNDS):
            clean, marker_at = self._draw(n, gen)
            length = clean.lengths
            ok = torch.ones(n, dtype=torch.bool)
            new_at = marker_at
            if kind != "content":
                new_at, ok = self._new_place(marker_at, length, gen)
            if kind == "position":
                rows = torch.arange(n)
                tokens = clean.tokens.clone()
                tokens[rows, marker_at] = clean.tokens[rows, new_at]
                tokens[rows, new_at] = self.marker
            else:
                used = torch.zeros(n, self.d_vocab, dtype=torch.bool).scatter_(
                    1, clean.tokens, True
                )
                values, available = self._draw_values(n, gen, exclude=used)
                ok &= available >= length - 1
                tokens = self._layout(values, new_at, length)
            labels = self._labels(tokens, new_at)
            ok &= labels != clean.labels
            corrupt = Batch(tokens, labels, clean.pad_mask.clone())
            cleans.append(clean[ok])
            corrupts.append(corrupt[ok])
            have += int(ok.sum())
            if have >= n:
                return CounterfactualPairs(Batch.cat(cleans)[:n], Batch.cat(corrupts)[:n])
        raise RuntimeError(
            f"{self}: could not build {n} {kind!r} counterfactuals (no other marker place fits the "
            "lengths, or too few values)"
        )

    def _new_place(
        self, marker_at: Tensor, length: Tensor, gen: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """A uniform new marker position per row that the generator could produce at the row's
        length, other than the current one, and whether the row has one."""
        places = torch.arange(1, self.max_side + 1) + self.extra_left  # [side]
        after = length[:, None] - 1 - places[None, :]
        valid = (after >= self.offset + self.extra_right) & (
            after <= self.max_after + self.extra_right
        )
        valid &= places[None, :] != marker_at[:, None]
        pick = torch.rand(valid.shape, generator=gen).masked_fill(~valid, -1.0).argmax(dim=1)
        return places[pick], valid.any(dim=1)

    # ----------------------------------------------------------------- exact baselines
    def _length_ways(self) -> Int[Tensor, " len"]:
        """How many (left, after) pairs give each length (index = length)."""
        left = torch.arange(1, self.max_side + 1) + self.extra_left
        after = torch.arange(self.offset, self.max_after + 1) + self.extra_right
        length = (left[:, None] + 1 + after[None, :]).reshape(-1)
        return torch.bincount(length, minlength=self.max_len + 1)

    def length_label_counts(self) -> Int[Tensor, "len n_classes"]:
        """Every (left, after) pair is equally likely and, given it, the target is uniform over
        the values (a row's values are a uniform sample without replacement): each length gets
        its number of pairs in every class."""
        return self._length_ways()[:, None].expand(-1, self.n_classes).clone()

    def content_only_accuracy(self) -> float:
        """Bayes-optimal accuracy from the set of tokens and the length, without their order:
        the target is equally likely any of the row's ``length - 1`` values, so this is
        ``E[1 / (length - 1)]`` (exact)."""
        ways = self._length_ways().tolist()
        total = sum(ways)
        return float(sum(Fraction(w, total * (length - 1)) for length, w in enumerate(ways) if w))

"""Task 2 (position-agnostic): count how many trigger tokens a sequence holds.

Follows the authors' ``count_gen/data-gen.py`` (paper digest §3): ``n_triggers`` trigger ids are
fixed for the whole task; each sample draws a count ``n ~ U{0..max_count}``, then ``n`` tokens
uniformly (with replacement) from the triggers and ``length - n`` fillers uniformly from the
non-trigger vocabulary, and shuffles them. Every sequence has exactly ``length`` tokens, so the
length carries no information. The label is the total count of *any* trigger.

The authors ignore label 0 in the loss and in accuracy. Two ways to follow them:
``TrainConfig(ignore_index=0)`` keeps the count-0 rows in the data and leaves them out of the
loss and of accuracy, exactly as their ``CrossEntropyLoss(ignore_index=0)`` (what
``authors_quirks=True`` sets); ``ignore_zero=True`` instead never generates ``n = 0`` (counts
1..max_count, class index ``n - 1``). ``dedup=True`` removes duplicate training rows (the authors
do not, on this task).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from jaxtyping import Int
from torch import Tensor

from pe_interp.tasks.base import SyntheticTask, check_bool, check_int
from pe_interp.tasks.batch import Batch, CounterfactualPairs
from pe_interp.tasks.sampling import draw_ids, random_subset


@dataclass(frozen=True)
class CountTask(SyntheticTask):
    """Count the trigger tokens in a fixed-length shuffled sequence (see the module docstring)."""

    d_vocab: int = 512
    n_triggers: int = 30
    max_count: int = 100
    length: int = 120
    ignore_zero: bool = False
    dedup: bool = False
    seed: int = 0

    name: ClassVar[str] = "count"
    extensions: ClassVar[tuple[str, ...]] = ("length",)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_bool(owner, "ignore_zero", self.ignore_zero)
        check_bool(owner, "dedup", self.dedup)
        check_int(owner, "n_triggers", self.n_triggers, 1)
        check_int(
            owner,
            "d_vocab",
            self.d_vocab,
            self.n_triggers + 2,
            why="PAD + n_triggers triggers + at least 1 filler",
        )
        check_int(owner, "length", self.length, 1)
        check_int(
            owner,
            "max_count",
            self.max_count,
            2 if self.ignore_zero else 1,
            self.length,
            why="at least 2 classes, and at most `length` triggers fit",
        )
        check_int(owner, "seed", self.seed, 0)

    # ----------------------------------------------------------------- vocabulary
    @cached_property
    def triggers(self) -> tuple[int, ...]:
        """The trigger ids (sorted)."""
        perm = torch.randperm(self.d_vocab - 1, generator=self.generator("triggers")) + 1
        return tuple(sorted(int(t) for t in perm[: self.n_triggers]))

    @cached_property
    def trigger_ids(self) -> Int[Tensor, " n_triggers"]:
        return torch.tensor(self.triggers)

    @cached_property
    def filler_ids(self) -> Int[Tensor, " n_fillers"]:
        ids = torch.arange(1, self.d_vocab)
        return ids[~torch.isin(ids, self.trigger_ids)]

    def _extended(self, family: str, extra: int) -> CountTask:
        """Longer sequences, the same count distribution (so the trigger density falls)."""
        return dataclasses.replace(self, length=self.length + extra)

    # ----------------------------------------------------------------- labels
    @property
    def max_len(self) -> int:
        return self.length

    @property
    def min_count(self) -> int:
        return 1 if self.ignore_zero else 0

    @cached_property
    def counts(self) -> Int[Tensor, " n_classes"]:
        """``counts[c]`` is the trigger count of class ``c``."""
        return torch.arange(self.min_count, self.max_count + 1)

    @property
    def label_values(self) -> Int[Tensor, " n_classes"]:
        return self.counts

    def class_to_count(self, c: int | Tensor) -> int | Tensor:
        return c + self.min_count

    def count_to_class(self, n: int | Tensor) -> int | Tensor:
        return n - self.min_count

    # ----------------------------------------------------------------- spans
    span_names: ClassVar[tuple[str, ...]] = ("trigger", "filler", "padding")

    def spans(self, batch: Batch) -> Int[Tensor, "batch pos"]:
        """Each position's part of its example: a ``trigger``, a ``filler``, or ``padding`` (the
        generator's rows have none; rows read from files may)."""
        is_trigger = torch.isin(batch.tokens, self.trigger_ids.to(batch.tokens.device))
        out = torch.where(is_trigger, 0, 1)
        return torch.where(batch.pad_mask.to(out.device), out, 2)

    # ----------------------------------------------------------------- generation
    def _with_counts(self, counts: Int[Tensor, " batch"], gen: torch.Generator) -> Batch:
        """One sequence per requested count: ``counts[i]`` triggers, shuffled among fillers.

        Shuffling ``n`` i.i.d. triggers with ``length - n`` i.i.d. fillers is the same as putting
        i.i.d. triggers on a uniformly random ``n``-subset of positions and i.i.d. fillers
        elsewhere, which is what this does (no sort needed).
        """
        n, shape = counts.shape[0], (counts.shape[0], self.length)
        is_trigger = random_subset(torch.ones(shape, dtype=torch.bool), counts, gen)
        trig = draw_ids(self.trigger_ids, shape, gen)
        fill = draw_ids(self.filler_ids, shape, gen)
        tokens = torch.where(is_trigger, trig, fill)
        pad_mask = torch.ones(n, self.length, dtype=torch.bool)
        return Batch(tokens, counts - self.min_count, pad_mask)

    def _generate(self, n: int, gen: torch.Generator) -> Batch:
        counts = torch.randint(self.min_count, self.max_count + 1, (n,), generator=gen)
        return self._with_counts(counts, gen)

    def _counterfactual(self, n: int, gen: torch.Generator) -> CounterfactualPairs:
        """Replace ``k`` of the clean row's triggers by fillers, so the count drops by ``k``.

        The clean count is uniform on ``min_count + 1 .. max_count`` (it needs a trigger to
        remove), ``k`` is uniform on ``1 .. count - min_count``, and the ``k`` triggers to replace
        are a uniform subset of the row's trigger positions.
        """
        counts = torch.randint(self.min_count + 1, self.max_count + 1, (n,), generator=gen)
        clean = self._with_counts(counts, gen)
        removable = counts - self.min_count
        k = (torch.rand(n, generator=gen, dtype=torch.float64) * removable).long() + 1
        k = torch.minimum(k, removable)  # guard against rounding at the top

        is_trigger = torch.isin(clean.tokens, self.trigger_ids)
        replace = random_subset(is_trigger, k, gen)
        fill = draw_ids(self.filler_ids, (n, self.length), gen)
        corrupt_tokens = torch.where(replace, fill, clean.tokens)
        corrupt = Batch(corrupt_tokens, clean.labels - k, clean.pad_mask.clone())
        return CounterfactualPairs(clean, corrupt)

    def _counterfactual_family(
        self, n: int, kind: str, gen: torch.Generator
    ) -> CounterfactualPairs:
        """The three families of :meth:`~pe_interp.tasks.base.SyntheticTask.counterfactuals`.

        The count does not depend on where the triggers are, so here position keeps the label and
        content changes it (the reverse of the distance task). Every corrupt row has the clean
        row's length.

        - ``"position"``: the same tokens, permuted uniformly at random given that the set of
          trigger positions changes; the count and the label stay. The clean count is uniform on
          ``max(min_count, 1) .. min(max_count, length - 1)`` (no triggers, or nothing else, has
          no position to move to).
        - ``"content"``: the same positions with ``|c' - c|`` tokens changing role and every other
          token unchanged: a new count ``c'`` uniform over the other counts; for ``c' < c`` a
          uniform subset of ``c - c'`` trigger positions gets fresh filler ids, for ``c' > c`` a
          uniform subset of ``c' - c`` filler positions gets fresh trigger ids (uniform, as the
          generator draws them). Label: ``c'``.
        - ``"both"``: the ``"content"`` corrupt row, permuted uniformly at random, so the
          triggers' positions change too. Label: ``c'``.
        """
        shape = (n, self.length)
        if kind == "position":
            low, high = max(self.min_count, 1), min(self.max_count, self.length - 1)
            if low > high:
                raise ValueError(
                    f"{self}: no {kind!r} counterfactual exists, every allowed count leaves the "
                    "triggers no other positions"
                )
            counts = torch.randint(low, high + 1, (n,), generator=gen)
            clean = self._with_counts(counts, gen)
            tokens = clean.tokens
            is_trigger = torch.isin(tokens, self.trigger_ids)
            corrupt_tokens = tokens.clone()
            redo = torch.ones(n, dtype=torch.bool)
            while bool(redo.any()):  # each round redraws the permutations that moved nothing
                order = torch.rand(shape, generator=gen).argsort(dim=1)
                moved = tokens.gather(1, order)
                corrupt_tokens = torch.where(redo[:, None], moved, corrupt_tokens)
                redo = (torch.isin(corrupt_tokens, self.trigger_ids) == is_trigger).all(dim=1)
            return CounterfactualPairs(
                clean, Batch(corrupt_tokens, clean.labels.clone(), clean.pad_mask.clone())
            )

        counts = torch.randint(self.min_count, self.max_count + 1, (n,), generator=gen)
        clean = self._with_counts(counts, gen)
        other = torch.randint(self.min_count, self.max_count, (n,), generator=gen)
        new_counts = other + (other >= counts).long()  # uniform over the counts other than c
        change = new_counts - counts
        is_trigger = torch.isin(clean.tokens, self.trigger_ids)
        to_filler = random_subset(is_trigger, (-change).clamp(min=0), gen)
        to_trigger = random_subset(~is_trigger, change.clamp(min=0), gen)
        fillers = draw_ids(self.filler_ids, shape, gen)
        triggers = draw_ids(self.trigger_ids, shape, gen)
        tokens = torch.where(to_filler, fillers, torch.where(to_trigger, triggers, clean.tokens))
        if kind == "both":
            tokens = tokens.gather(1, torch.rand(shape, generator=gen).argsort(dim=1))
        corrupt = Batch(tokens, new_counts - self.min_count, clean.pad_mask.clone())
        return CounterfactualPairs(clean, corrupt)

    # ----------------------------------------------------------------- exact baselines
    def length_label_counts(self) -> Int[Tensor, "len n_classes"]:
        """Every sequence has ``length`` tokens and the classes are uniform: one count each."""
        counts = torch.zeros(self.length + 1, self.n_classes, dtype=torch.long)
        counts[self.length] = 1
        return counts

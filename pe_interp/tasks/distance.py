"""Task 1 (position-sensitive): classify the distance between two trigger tokens.

Follows the authors' ``dis_gen/data-gen.py`` (paper digest §3): one ordered trigger pair
``(t1, t2)`` fixed for the whole task; ``left ~ U{1..max_side}`` fillers, then ``t1``,
``between ~ U{1..max_between}`` fillers, ``t2``, ``right ~ U{1..max_side}`` fillers; truncated to
``max_len`` keeping the start. The label is ``distance = between + 1`` (2..max_between+1), class
index ``distance - 2``.

By default fillers are drawn with replacement and exclude the triggers, so every sequence holds
exactly one ``t1`` and one ``t2``. Each way the authors' generator differs is a switch:

- ``fillers_include_triggers=True``: fillers can be the trigger ids (the authors' ambiguous
  variant; the label is still the generator's true distance);
- ``distinct_fillers=True``: the fillers of each segment (left, middle, right) are drawn without
  replacement, as the authors' per-segment ``random.sample``;
- ``dedup=True``: exact duplicate training sequences are removed (and refilled), as the authors
  deduplicate their generated set. Test rows never repeat a training row in any case.

For length generalisation, ``extra_left`` / ``extra_right`` add that many fillers to every row's
left / right side (``left ~ U{1..max_side} + extra_left``): the triggers move ``extra_left``
positions right, the distances and classes stay (:meth:`~pe_interp.tasks.base.SyntheticTask.extended`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from jaxtyping import Int
from torch import Tensor

from pe_interp.tasks.base import SyntheticTask, check_bool, check_int, extend_sides
from pe_interp.tasks.batch import PAD_ID, Batch, CounterfactualPairs
from pe_interp.tasks.distance_moves import TriggerMoves
from pe_interp.tasks.sampling import draw_ids

_MAX_REJECTION_ROUNDS = 100


@dataclass(frozen=True)
class DistanceTask(SyntheticTask, TriggerMoves):
    """Two fixed triggers; the class is their distance (see the module docstring)."""

    d_vocab: int = 512
    max_between: int = 70
    max_side: int = 25
    max_len: int = 120  # type: ignore[assignment]
    fillers_include_triggers: bool = False
    distinct_fillers: bool = False
    dedup: bool = False
    extra_left: int = 0
    extra_right: int = 0
    seed: int = 0

    name: ClassVar[str] = "distance"
    extensions: ClassVar[tuple[str, ...]] = ("shift", "sides", "right")

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_bool(owner, "fillers_include_triggers", self.fillers_include_triggers)
        check_bool(owner, "distinct_fillers", self.distinct_fillers)
        check_bool(owner, "dedup", self.dedup)
        check_int(owner, "d_vocab", self.d_vocab, 4, why="PAD + 2 triggers + at least 1 other id")
        check_int(owner, "max_between", self.max_between, 2, why="at least 2 distance classes")
        check_int(owner, "max_side", self.max_side, 1)
        check_int(owner, "extra_left", self.extra_left, 0)
        check_int(owner, "extra_right", self.extra_right, 0)
        need = self.extra_left + self.max_side + self.max_between + 2
        check_int(
            owner,
            "max_len",
            self.max_len,
            need,
            why=f"extra_left + max_side + max_between + 2 = {need}, so truncation never cuts the second trigger",
        )
        check_int(owner, "seed", self.seed, 0)
        pool = self.d_vocab - (1 if self.fillers_include_triggers else 3)
        segment = max(self.max_between, self.max_side + max(self.extra_left, self.extra_right))
        if self.distinct_fillers and pool < segment:
            raise ValueError(
                f"{owner}.distinct_fillers: a segment of up to {segment} "
                f"distinct fillers needs at least that many filler ids; d_vocab={self.d_vocab} gives {pool}"
            )

    # ----------------------------------------------------------------- vocabulary
    @cached_property
    def triggers(self) -> tuple[int, int]:
        """The ordered trigger pair ``(t1, t2)``; ``t1`` always comes first."""
        perm = torch.randperm(self.d_vocab - 1, generator=self.generator("triggers")) + 1
        return int(perm[0]), int(perm[1])

    @cached_property
    def filler_ids(self) -> Int[Tensor, " n_fillers"]:
        """The ids fillers are drawn from, uniformly."""
        ids = torch.arange(1, self.d_vocab)
        if self.fillers_include_triggers:
            return ids
        return ids[~torch.isin(ids, torch.tensor(self.triggers))]

    # ----------------------------------------------------------------- labels
    @cached_property
    def distances(self) -> Int[Tensor, " n_classes"]:
        """``distances[c]`` is the trigger distance of class ``c`` (``c + 2``)."""
        return torch.arange(2, self.max_between + 2)

    @property
    def label_values(self) -> Int[Tensor, " n_classes"]:
        return self.distances

    @staticmethod
    def class_to_distance(c: int | Tensor) -> int | Tensor:
        return c + 2

    @staticmethod
    def distance_to_class(d: int | Tensor) -> int | Tensor:
        return d - 2

    # ----------------------------------------------------------------- spans
    span_names: ClassVar[tuple[str, ...]] = (
        "prefix",
        "trigger1",
        "between",
        "trigger2",
        "suffix",
        "padding",
    )

    def spans(self, batch: Batch) -> Int[Tensor, "batch pos"]:
        """Each position's part of its example: the left fillers (``prefix``), ``t1``
        (``trigger1``), the fillers ``between``, ``t2`` (``trigger2``), the right fillers
        (``suffix``), pads (``padding``). The triggers are the ``t1`` and ``t2`` at the labelled
        distance (``label + 2``); with ``fillers_include_triggers`` a trigger-valued filler could
        form a second such pair, and the leftmost is taken."""
        tokens, labels = batch.tokens, batch.labels
        n, width = tokens.shape
        t1, t2 = self.triggers
        pos = torch.arange(width, device=tokens.device)
        d = self.class_to_distance(labels.long())[:, None]
        ahead = tokens.gather(1, (pos[None] + d).clamp(max=width - 1))
        pair = (tokens == t1) & (ahead == t2) & (pos[None] + d < width)
        if not bool(pair.any(1).all()):
            row = int((~pair.any(1)).nonzero()[0, 0])
            raise ValueError(
                f"{self.name}: row {row} holds no t1 followed by t2 at its labelled distance"
            )
        first = pair.to(torch.int8).argmax(1)[:, None]
        second = first + d
        out = torch.full_like(tokens, 2)  # between
        out = torch.where(pos < first, 0, out)
        out = torch.where(pos == first, 1, out)
        out = torch.where(pos == second, 3, out)
        out = torch.where(pos > second, 4, out)
        return torch.where(batch.pad_mask.to(tokens.device), out, 5)

    # ----------------------------------------------------------------- generation
    def _draw(self, n: int, gen: torch.Generator) -> tuple[Batch, Tensor, Tensor]:
        """Samples plus the generator's trigger positions ``first`` and ``second`` per row."""
        left = torch.randint(1, self.max_side + 1, (n,), generator=gen) + self.extra_left
        between = torch.randint(1, self.max_between + 1, (n,), generator=gen)
        right = torch.randint(1, self.max_side + 1, (n,), generator=gen) + self.extra_right
        first, second = left, left + between + 1
        pos = torch.arange(self.max_len)
        if self.distinct_fillers:
            tokens = self._distinct_segments(n, first, second, gen)
        else:
            tokens = draw_ids(self.filler_ids, (n, self.max_len), gen)
        t1, t2 = self.triggers
        tokens = torch.where(pos == first[:, None], t1, tokens)
        tokens = torch.where(pos == second[:, None], t2, tokens)
        length = torch.clamp(left + between + right + 2, max=self.max_len)
        pad_mask = pos < length[:, None]
        tokens = torch.where(pad_mask, tokens, PAD_ID)
        return Batch(tokens, between - 1, pad_mask), first, second

    def _distinct_segments(
        self, n: int, first: Tensor, second: Tensor, gen: torch.Generator
    ) -> Tensor:
        """Fillers with no repeat inside each of the three segments (positions ``< first``,
        between the triggers, ``> second``); the trigger slots are overwritten by the caller."""
        ids = self.filler_ids

        def segment(size: int) -> Tensor:  # [n, size]: a uniform ordered sample without replacement
            return ids[torch.rand(n, len(ids), generator=gen).topk(size, dim=1).indices]

        sl, sr = self._side_sizes
        left, middle, right = segment(sl), segment(self.max_between), segment(sr)
        pos = torch.arange(self.max_len)[None, :]
        tokens = torch.where(
            pos < first[:, None],
            left.gather(1, pos.clamp(max=sl - 1).expand(n, -1)),
            middle.gather(1, (pos - first[:, None] - 1).clamp(0, self.max_between - 1)),
        )
        after = right.gather(1, (pos - second[:, None] - 1).clamp(0, sr - 1))
        return torch.where(pos > second[:, None], after, tokens)

    @property
    def _side_sizes(self) -> tuple[int, int]:
        """The longest left and right filler segments."""
        return self.max_side + self.extra_left, self.max_side + self.extra_right

    def _extended(self, family: str, extra: int) -> DistanceTask:
        return extend_sides(self, family, extra)

    def _generate(self, n: int, gen: torch.Generator) -> Batch:
        return self._draw(n, gen)[0]

    def _counterfactual(self, n: int, gen: torch.Generator) -> CounterfactualPairs:
        """Move the second trigger: swap it with a filler at another valid position.

        The new position ``p`` is uniform over the real positions with ``p - first`` a valid
        distance other than the current one, so ``t1`` stays, every filler stays (one moves into
        ``t2``'s old slot), and only two positions change. With ``fillers_include_triggers`` a
        position holding a trigger-valued filler is not a candidate, so the tokens always change;
        rows with no candidate (possible only at tiny vocabularies) are redrawn.
        """
        cleans, corrupts, have = [], [], 0
        for _ in range(_MAX_REJECTION_ROUNDS):
            clean, first, second = self._draw(n, gen)
            tokens = clean.tokens
            pos = torch.arange(self.max_len)
            new_distance = pos - first[:, None]
            candidate = (new_distance >= 2) & (new_distance <= self.max_between + 1)
            candidate &= clean.pad_mask & (pos != second[:, None])
            if self.fillers_include_triggers:
                candidate &= ~torch.isin(tokens, torch.tensor(self.triggers))
            keys = torch.rand(n, self.max_len, generator=gen).masked_fill(~candidate, -1.0)
            target = keys.argmax(dim=1)
            ok = candidate.any(dim=1)

            rows = torch.arange(n)
            corrupt_tokens = tokens.clone()
            corrupt_tokens[rows, second] = tokens[rows, target]
            corrupt_tokens[rows, target] = self.triggers[1]
            corrupt = Batch(corrupt_tokens, target - first - 2, clean.pad_mask.clone())
            cleans.append(clean[ok])
            corrupts.append(corrupt[ok])
            have += int(ok.sum())
            if have >= n:
                return CounterfactualPairs(Batch.cat(cleans)[:n], Batch.cat(corrupts)[:n])
        raise RuntimeError(
            f"{self}: could not build {n} counterfactual pairs (vocabulary too small)"
        )

    def _counterfactual_family(
        self, n: int, kind: str, gen: torch.Generator
    ) -> CounterfactualPairs:
        """The three families of :meth:`~pe_interp.tasks.base.SyntheticTask.counterfactuals`.

        Every corrupt row has the clean row's length and ``pad_mask``; ``t1`` comes before
        ``t2`` once each.

        - ``"position"``: the same tokens (the same multiset, the same fillers at all but at most
          two positions) with the triggers moved to a new placement at another distance. The
          placement is uniform over those the generator could produce at this length: new left
          side ``1..max_side`` (plus ``extra_left``), distance ``2..max_between + 1`` other than
          the clean one, right side ``1..max_side`` (plus ``extra_right``; from 0 when the row
          fills ``max_len``, as truncation allows). ``t1`` swaps with the token in its new slot, then ``t2`` does, so the fillers
          that were there take the triggers' old slots and at most four positions change. With
          ``fillers_include_triggers`` a slot holding a trigger-valued filler is never a new slot;
          with ``distinct_fillers`` a corrupt row whose moved fillers repeat one in their new
          segment is redrawn. Label: the new distance.
        - ``"content"``: the same trigger positions (so the same label) with every filler redrawn,
          by the generator's rule (i.i.d., or without repeats per segment with
          ``distinct_fillers``), from the filler ids that occur nowhere in the clean row: the two
          rows share no filler id, so every filler position changes.
        - ``"both"``: the new placement of ``"position"`` with the fillers of ``"content"``
          (drawn from the ids absent from the clean row). Label: the new distance.

        Rows that admit no such corrupt row (no other placement fits the length, as with
        ``max_side=1``; too few unused filler ids, at tiny vocabularies) are redrawn, which
        conditions the clean rows on admitting one.
        """
        cleans, corrupts, have = [], [], 0
        for _ in range(_MAX_REJECTION_ROUNDS):
            clean, first, second = self._draw(n, gen)
            ok = torch.ones(n, dtype=torch.bool)
            new_first, new_second = first, second
            if kind != "content":
                new_first, new_second, ok = self._new_placement(clean, first, second, gen)
            if kind == "position":
                tokens = self._move_triggers(clean.tokens, first, second, new_first, new_second)
                if self.distinct_fillers:  # moved fillers may repeat one in their new segment
                    ok &= self._segments_distinct(tokens, new_first, new_second, clean.pad_mask)
            else:
                tokens, fits = self._unused_fillers(clean, new_first, new_second, gen)
                ok &= fits
            corrupt = Batch(tokens, new_second - new_first - 2, clean.pad_mask.clone())
            cleans.append(clean[ok])
            corrupts.append(corrupt[ok])
            have += int(ok.sum())
            if have >= n:
                return CounterfactualPairs(Batch.cat(cleans)[:n], Batch.cat(corrupts)[:n])
        raise RuntimeError(
            f"{self}: could not build {n} {kind!r} counterfactuals (no other placement fits the "
            "lengths, or too few filler ids)"
        )

    # ----------------------------------------------------------------- exact baselines
    def length_label_counts(self) -> Int[Tensor, "len n_classes"]:
        """Counts of (left, between, right) triples per (length, class); total B * S**2.

        ``s = left + right`` (before the extras) takes value ``s`` in ``min(s - 1, 2S + 1 - s)``
        ways; the length is ``min(s + extra_left + extra_right + between + 2, max_len)`` and the
        class ``between - 1``.
        """
        side, most = self.max_side, self.max_between
        s = torch.arange(2, 2 * side + 1)
        ways = torch.minimum(s - 1, 2 * side + 1 - s)
        between = torch.arange(1, most + 1)
        extra = self.extra_left + self.extra_right
        length = torch.clamp(s[:, None] + between[None, :] + 2 + extra, max=self.max_len)
        cls = (between - 1).expand_as(length)
        counts = torch.zeros(self.max_len + 1, most, dtype=torch.long)
        counts.index_put_(
            (length.reshape(-1), cls.reshape(-1)),
            ways[:, None].expand_as(length).reshape(-1),
            accumulate=True,
        )
        return counts

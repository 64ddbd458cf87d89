"""The edits that turn a task-1 row into its counterfactuals: the triggers moved to another
placement, the fillers redrawn from the ids the row does not use.

:class:`TriggerMoves` holds the row-level steps of the position, content and both families
(``DistanceTask._counterfactual_family``): a uniform new trigger placement at another distance,
the triggers swapped into it, whether the fillers of each segment are still distinct, and rows
refilled from unused filler ids. It is a mixin of :class:`~pe_interp.tasks.distance.DistanceTask`
and reads that task's fields (``max_side``, ``max_between``, ``max_len``, the extras, the triggers
and the filler ids).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pe_interp.tasks.batch import PAD_ID, Batch

__all__ = ["TriggerMoves"]


class TriggerMoves:
    """Counterfactual row edits of :class:`~pe_interp.tasks.distance.DistanceTask` (a mixin)."""

    def _new_placement(self, clean: Batch, first: Tensor, second: Tensor, gen: torch.Generator):
        """A uniform trigger placement ``(new_first, new_second)`` at another distance that the
        generator could produce at each row's length, and whether the row has one."""
        n, side, most = len(clean), self.max_side, self.max_between
        length = clean.lengths
        lefts = torch.arange(1, side + 1) + self.extra_left
        distances = torch.arange(2, most + 2)
        seconds = lefts[:, None] + distances[None, :]  # [side, distance]
        right = length[:, None, None] - 1 - seconds
        # 0 only where truncation can leave none
        lowest_right = torch.where(length < self.max_len, 1 + self.extra_right, 0)
        valid = (right >= lowest_right[:, None, None]) & (right <= side + self.extra_right)
        valid &= distances != (second - first)[:, None, None]
        if self.fillers_include_triggers:  # never move a trigger onto a trigger-valued filler
            pos = torch.arange(self.max_len)
            free = ~torch.isin(clean.tokens, torch.tensor(self.triggers))
            free |= (pos == first[:, None]) | (pos == second[:, None])
            at_second = free.gather(
                1, seconds.clamp(max=self.max_len - 1).view(1, -1).expand(n, -1)
            )
            valid &= free[:, lefts][:, :, None] & at_second.view(n, side, most)
        valid = valid.reshape(n, side * most)
        pick = torch.rand(valid.shape, generator=gen).masked_fill(~valid, -1.0).argmax(dim=1)
        new_first = lefts[pick // most]
        return new_first, new_first + distances[pick % most], valid.any(dim=1)

    def _move_triggers(
        self, tokens: Tensor, first: Tensor, second: Tensor, new_first: Tensor, new_second: Tensor
    ) -> Tensor:
        """``t1`` swaps with the token at ``new_first``, then ``t2`` with the one at ``new_second``."""
        rows = torch.arange(tokens.shape[0])

        def swap(t: Tensor, i: Tensor, j: Tensor) -> Tensor:
            t = t.clone()
            at_i = t[rows, i].clone()
            t[rows, i] = t[rows, j]
            t[rows, j] = at_i
            return t

        tokens = swap(tokens, first, new_first)
        second_now = torch.where(new_first == second, first, second)  # t2 moved if t1 took its slot
        return swap(tokens, second_now, new_second)

    def _segments_distinct(
        self, tokens: Tensor, first: Tensor, second: Tensor, pad_mask: Tensor
    ) -> Tensor:
        """Whether no filler id repeats within a segment (before, between, after the triggers)."""
        pos = torch.arange(self.max_len)[None, :]
        segment = (pos > first[:, None]).long() + (pos > second[:, None]).long()
        is_filler = pad_mask & (pos != first[:, None]) & (pos != second[:, None])
        keys = torch.where(is_filler, segment * self.d_vocab + tokens, -1 - pos).sort(dim=1).values
        return ~((keys[:, 1:] == keys[:, :-1]) & (keys[:, 1:] >= 0)).any(dim=1)

    def _unused_fillers(
        self, clean: Batch, first: Tensor, second: Tensor, gen: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """Rows with ``t1`` at ``first``, ``t2`` at ``second`` and fillers drawn from the filler
        ids absent from the clean row (by the generator's rule), and whether each row could."""
        n, vocab = len(clean), self.d_vocab
        is_filler = torch.zeros(vocab, dtype=torch.bool)
        is_filler[self.filler_ids] = True
        used = torch.zeros(n, vocab, dtype=torch.bool).scatter_(1, clean.tokens, True)
        pool = is_filler[None, :] & ~used  # [n, vocab]
        available = pool.sum(dim=1)
        pos = torch.arange(self.max_len)[None, :]
        if self.distinct_fillers:

            def segment(size: int) -> Tensor:  # [n, size]; the first `available` are pool ids
                keys = torch.rand(n, vocab, generator=gen).masked_fill(~pool, -1.0)
                return keys.topk(size, dim=1).indices

            sl, sr = self._side_sizes
            left, middle, right = segment(sl), segment(self.max_between), segment(sr)
            need = torch.stack([first, second - first - 1, clean.lengths - second - 1], dim=1)
            fits = (need <= available[:, None]).all(dim=1)
            tokens = torch.where(
                pos < first[:, None],
                left.gather(1, pos.clamp(max=sl - 1).expand(n, -1)),
                middle.gather(1, (pos - first[:, None] - 1).clamp(0, self.max_between - 1)),
            )
            after = right.gather(1, (pos - second[:, None] - 1).clamp(0, sr - 1))
            tokens = torch.where(pos > second[:, None], after, tokens)
        else:
            pool_first = torch.argsort((~pool).to(torch.int8), dim=1, stable=True)
            index = (
                torch.rand(n, self.max_len, generator=gen, dtype=torch.float64) * available[:, None]
            )
            tokens = pool_first.gather(1, index.long().clamp(max=vocab - 1))
            fits = available >= 1
        t1, t2 = self.triggers
        tokens = torch.where(pos == first[:, None], t1, tokens)
        tokens = torch.where(pos == second[:, None], t2, tokens)
        return torch.where(clean.pad_mask, tokens, PAD_ID), fits

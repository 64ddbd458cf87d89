"""Batches of token sequences, counterfactual pairs, and row hashing.

A :class:`Batch` is what every task produces and every model consumes: right-padded token ids,
one class index per row, and a mask of real tokens. Token ids are used directly (no tokenizer);
``PAD_ID = 0`` is the only reserved id, so a real token is never 0 and two rows hold the same
sequence exactly when their padded token rows are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

PAD_ID: int = 0

Index = slice | Tensor | Sequence[int]


def _check_index(index: object) -> None:
    if isinstance(index, int | bool):
        raise TypeError(
            f"index a Batch with a slice, a list or an index/bool tensor, not {type(index).__name__}; "
            "use batch[i : i + 1] for a single row"
        )


@dataclass(frozen=True, eq=False)
class Batch:
    """Right-padded token sequences with one class label each.

    The constructor checks shapes and dtypes only (cheap, no device sync); :meth:`validate`
    checks the data invariants (right padding, pads are ``PAD_ID``, real tokens are not).
    """

    tokens: Int[Tensor, "batch pos"]
    labels: Int[Tensor, " batch"]
    pad_mask: Bool[Tensor, "batch pos"]  # True = real token, False = padding

    def __post_init__(self) -> None:
        for name in ("tokens", "labels", "pad_mask"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                kind = (
                    "a numpy array" if type(value).__module__ == "numpy" else type(value).__name__
                )
                raise ValueError(
                    f"Batch.{name} must be a torch tensor, got {kind}; convert it with torch.as_tensor()"
                )
        if self.tokens.dim() != 2 or self.tokens.dtype != torch.long:
            raise ValueError(
                f"Batch.tokens must be a 2-D int64 tensor, got {self.tokens.dtype} "
                f"of shape {tuple(self.tokens.shape)}"
            )
        if self.labels.shape != self.tokens.shape[:1] or self.labels.dtype != torch.long:
            raise ValueError(
                f"Batch.labels must be an int64 tensor of shape {tuple(self.tokens.shape[:1])}, "
                f"got {self.labels.dtype} of shape {tuple(self.labels.shape)}"
            )
        if self.pad_mask.shape != self.tokens.shape or self.pad_mask.dtype != torch.bool:
            raise ValueError(
                f"Batch.pad_mask must be a bool tensor of shape {tuple(self.tokens.shape)}, "
                f"got {self.pad_mask.dtype} of shape {tuple(self.pad_mask.shape)}"
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: Index) -> Batch:
        """Rows selected by a slice, a list of row indices, or an index / boolean tensor."""
        _check_index(index)
        if isinstance(index, Tensor):
            index = index.to(self.tokens.device)
        elif not isinstance(index, slice):
            index = torch.as_tensor(list(index), dtype=torch.long, device=self.tokens.device)
        return Batch(self.tokens[index], self.labels[index], self.pad_mask[index])

    @property
    def max_len(self) -> int:
        """The padded length (number of columns)."""
        return self.tokens.shape[1]

    @property
    def lengths(self) -> Int[Tensor, " batch"]:
        """The number of real (non-pad) tokens in each row."""
        return self.pad_mask.sum(dim=1)

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.tokens.to(device), self.labels.to(device), self.pad_mask.to(device))

    def validate(self, d_vocab: int | None = None) -> Batch:
        """Check the data invariants; return ``self`` so it can be chained. Raises ValueError."""
        mask = self.pad_mask
        if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise ValueError("Batch is not right-padded: a real token follows a pad")
        if bool((self.tokens[~mask] != PAD_ID).any()):
            raise ValueError(f"Batch has a non-pad token where pad_mask is False (PAD_ID={PAD_ID})")
        real = self.tokens[mask]
        if bool((real == PAD_ID).any()):
            raise ValueError(f"Batch has PAD_ID={PAD_ID} where pad_mask is True")
        if d_vocab is not None and bool((real >= d_vocab).any()):
            raise ValueError(f"Batch has token ids >= d_vocab={d_vocab}")
        if bool((self.labels < 0).any()):
            raise ValueError("Batch has negative labels")
        return self

    @staticmethod
    def cat(batches: Sequence[Batch]) -> Batch:
        """Concatenate batches with the same padded length along the batch axis."""
        if not batches:
            raise ValueError("Batch.cat needs at least one batch")
        return Batch(
            torch.cat([b.tokens for b in batches]),
            torch.cat([b.labels for b in batches]),
            torch.cat([b.pad_mask for b in batches]),
        )

    @staticmethod
    def empty(max_len: int) -> Batch:
        """A batch with zero rows and ``max_len`` columns."""
        return Batch(
            torch.zeros(0, max_len, dtype=torch.long),
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, max_len, dtype=torch.bool),
        )


@dataclass(frozen=True, eq=False)
class CounterfactualPairs:
    """Clean/corrupt inputs for activation patching.

    Row ``i`` of ``clean`` and of ``corrupt`` have the same length and the same ``pad_mask`` (so
    positions line up); they differ only in the tokens the task's counterfactual changes (see
    :attr:`changed`). Their labels differ, except in the families of
    :meth:`~pe_interp.tasks.base.SyntheticTask.counterfactuals` that keep the label by design
    (distance ``"content"``, count ``"position"``).
    """

    clean: Batch
    corrupt: Batch

    def __post_init__(self) -> None:
        if self.clean.tokens.shape != self.corrupt.tokens.shape:
            raise ValueError(
                f"CounterfactualPairs: clean and corrupt shapes differ: "
                f"{tuple(self.clean.tokens.shape)} vs {tuple(self.corrupt.tokens.shape)}"
            )

    def __len__(self) -> int:
        return len(self.clean)

    def __getitem__(self, index: Index) -> CounterfactualPairs:
        return CounterfactualPairs(self.clean[index], self.corrupt[index])

    @property
    def changed(self) -> Bool[Tensor, "batch pos"]:
        """Positions where the corrupt tokens differ from the clean ones."""
        return self.clean.tokens != self.corrupt.tokens

    def to(self, device: torch.device | str) -> CounterfactualPairs:
        return CounterfactualPairs(self.clean.to(device), self.corrupt.to(device))


# Two polynomial hashes modulo primes below 2**31: every intermediate product stays below 2**62,
# so int64 arithmetic never overflows, and the combined key is a 62-bit integer.
_MOD = (2_147_483_647, 2_147_483_629)
_BASE = (1_000_003, 911_382_323)


def row_hashes(tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, " batch"]:
    """A 62-bit hash of each row, vectorised over rows (one torch op per column).

    Equal rows always get equal keys, so comparing keys never misses a duplicate; distinct rows
    collide with probability about 2**-62 per pair, which at worst drops a row needlessly.
    """
    tokens = tokens.long()
    h1 = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    h2 = torch.zeros_like(h1)
    for column in tokens.T:
        h1 = torch.remainder(h1 * _BASE[0] + column, _MOD[0])
        h2 = torch.remainder(h2 * _BASE[1] + column, _MOD[1])
    return h1 * (1 << 31) + h2

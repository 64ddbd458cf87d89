"""Vectorised sampling helpers shared by the tasks.

Both helpers exist for speed on CPU: ``Tensor.index_select`` is an order of magnitude faster than
advanced indexing for large gathers, and selection sampling over columns avoids sorting
``[batch, pos]`` random keys (``argsort`` of 10k x 120 keys costs more than the rest of a sample).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Int
from torch import Tensor


def draw_ids(
    ids: Int[Tensor, " n_ids"], shape: tuple[int, int], gen: torch.Generator
) -> Int[Tensor, "batch pos"]:
    """Tokens drawn uniformly (with replacement) from ``ids``."""
    index = torch.randint(len(ids), shape, generator=gen)
    return ids.index_select(0, index.view(-1)).view(shape)


def random_subset(
    eligible: Bool[Tensor, "batch pos"], sizes: Int[Tensor, " batch"], gen: torch.Generator
) -> Bool[Tensor, "batch pos"]:
    """A uniformly random subset of each row's eligible positions, of size ``sizes[row]``.

    Selection sampling (Knuth's Algorithm S), vectorised over rows with one step per column:
    an eligible position is taken with probability (still to take) / (eligible positions left),
    which makes every subset of the requested size equally likely. Requires
    ``sizes <= eligible.sum(1)``.
    """
    n, n_pos = eligible.shape
    if bool((sizes > eligible.sum(dim=1)).any()):
        raise ValueError("random_subset: a row asks for more positions than it has eligible")
    # Column-major so that each step reads contiguous memory.
    eligible_t = eligible.T.contiguous()
    uniform = torch.rand(n_pos, n, generator=gen, dtype=torch.float64)
    remaining = eligible.sum(dim=1).to(torch.float64)  # eligible positions from column j on
    to_take = sizes.to(torch.float64)
    columns = []
    for j in range(n_pos):  # take j with probability to_take / remaining
        is_eligible = eligible_t[j]
        take = is_eligible & (uniform[j] * remaining < to_take)
        columns.append(take)
        to_take = to_take - take.to(torch.float64)
        remaining = remaining - is_eligible.to(torch.float64)
    return torch.stack(columns, dim=1)

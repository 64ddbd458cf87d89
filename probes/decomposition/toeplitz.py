"""How much of a ``[..., q, k]`` matrix is a function of the relative position ``j - i`` alone."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["diagonal_means", "toeplitz_score"]


def diagonal_means(matrix: Tensor, valid: Tensor | None = None) -> Tensor:
    """Replace every entry of ``[..., q, k]`` by the mean of its diagonal (``j - i`` constant),
    averaging only over ``valid`` entries (a diagonal with no valid entry gives 0)."""
    *lead, n_q, n_k = matrix.shape
    if valid is None:
        valid = torch.ones(n_q, n_k, dtype=torch.bool, device=matrix.device)
    valid = valid.expand(matrix.shape)
    diag = (
        torch.arange(n_k, device=matrix.device)[None, :]
        - torch.arange(n_q, device=matrix.device)[:, None]
    ) + (n_q - 1)
    index = diag.reshape(-1).expand(*lead, n_q * n_k)
    w = valid.to(matrix.dtype).reshape(*lead, n_q * n_k)
    x = torch.where(
        valid, matrix, torch.zeros((), dtype=matrix.dtype, device=matrix.device)
    ).reshape(*lead, n_q * n_k)
    sums = torch.zeros(*lead, n_q + n_k - 1, dtype=matrix.dtype, device=matrix.device).scatter_add_(
        -1, index, x
    )
    counts = torch.zeros_like(sums).scatter_add_(-1, index, w)
    means = sums / counts.clamp(min=1)
    return means.gather(-1, index).reshape(matrix.shape)


def toeplitz_score(matrix: Tensor, valid: Tensor | None = None) -> Tensor:
    """Fraction of the variance of ``matrix [..., q, k]`` over the ``valid`` entries explained by
    its diagonal means: ``1 - SS_res / SS_tot``, where ``SS_res`` sums the squared deviations from
    each entry's diagonal mean and ``SS_tot`` those from the overall mean (both over ``valid``).

    The diagonal means are the least-squares Toeplitz fit, so the score is the R^2 of "this
    matrix is a function of the relative position ``j - i``": 1 for a Toeplitz matrix (ALiBi, T5,
    any RoPE kernel), near ``(n_q + n_k - 1) / n_valid`` for noise. ``valid`` (broadcastable bool,
    e.g. the causal lower triangle or the non-pad square) defaults to every entry. Returns NaN
    where the matrix is constant over ``valid`` (0 / 0). Leading dims are batched.
    """
    matrix = (
        matrix.double()
        if matrix.dtype in (torch.float16, torch.bfloat16, torch.float32)
        else matrix
    )
    if valid is None:
        valid = torch.ones(matrix.shape[-2:], dtype=torch.bool, device=matrix.device)
    valid = valid.to(matrix.device).expand(matrix.shape)
    zero = torch.zeros((), dtype=matrix.dtype, device=matrix.device)
    n = valid.sum((-2, -1)).to(matrix.dtype)
    x = torch.where(valid, matrix, zero)
    mean = x.sum((-2, -1)) / n.clamp(min=1)
    ss_tot = torch.where(valid, (matrix - mean[..., None, None]) ** 2, zero).sum((-2, -1))
    ss_res = torch.where(valid, (matrix - diagonal_means(matrix, valid)) ** 2, zero).sum((-2, -1))
    scale = torch.where(valid, matrix**2, zero).sum((-2, -1))
    degenerate = ss_tot <= 1e-20 * scale.clamp(min=1e-300)
    return torch.where(
        degenerate, torch.full_like(ss_tot, math.nan), 1 - ss_res / ss_tot.clamp(min=1e-300)
    )

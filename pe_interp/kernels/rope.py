"""The one implementation of the rotary rotation, for the model (:mod:`pe_interp.encodings.rotary`)
and the kernel's plain-torch reference (:mod:`pe_interp.kernels.reference`).

Pair layout, pinned: **adjacent (interleaved) pairs**, as in the authors' code and GPT-J. Pair i
of a rotated span ``[start, start + dim)`` is dims ``(start + 2i, start + 2i + 1)``, rotated at
position p by the angle ``p * theta_i`` with ``theta_i = base^(-2i/dim)``::

    x'[2i]   = x[2i] * cos - x[2i+1] * sin
    x'[2i+1] = x[2i] * sin + x[2i+1] * cos

In fp32/fp64 this is computed as one complex multiply, ``(x[2i] + i x[2i+1]) * (cos + i sin)``:
the same arithmetic without the strided copies of the two-real form (measured 1.6x faster for a
whole training step of the ``mid`` model on one CPU core). Half-precision inputs (bf16 under
autocast) are rotated in fp32 the same way and rounded once at the end: more accurate than bf16
arithmetic, and 2.8x faster than the two-real form in bf16 (forward and backward at the paper's
q shape, one core of an avx512_bf16 Xeon), whose strided element-wise bf16 products were 14% of
a bf16 training step. The two-real form remains for an explicit half ``compute_dtype``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_rope", "rope_angles", "rope_frequencies"]


def rope_frequencies(dim: int, base: float) -> Tensor:
    """``theta_i = base^(-2i/dim)`` for the ``dim // 2`` pairs, float64 (rad/token)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rope_angles(n_pos: int, dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables, each ``[n_pos, dim // 2]`` (computed in float64, stored float32)."""
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * rope_frequencies(dim, base)
    return angles.cos().float(), angles.sin().float()


def apply_rope(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    start: int = 0,
    head_mask: Tensor | None = None,
    *,
    heads_first: bool = False,
    compute_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """Rotate dims ``[start, start + 2 * cos.shape[-1])`` of every head (or of the heads where
    ``head_mask``, bool ``[head]``) by position.

    ``x`` is ``[batch, pos, head, d]`` (the model's layout) or, with ``heads_first``,
    ``[batch, head, pos, d]`` (the kernel's). ``cos``/``sin`` are ``[n_pos >= pos, dim // 2]``.
    The rotation runs in ``compute_dtype`` (default ``x.dtype``, fp32 for half-precision ``x``)
    and the result has ``out_dtype`` (default ``x.dtype``; under autocast the model keeps the
    fp32 result, which its attention consumes in fp32 or casts once, see
    :mod:`pe_interp.models.hooked.attn_routes`).
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    n_pos = x.shape[2 if heads_first else 1]
    dim = 2 * cos.shape[-1]
    if compute_dtype is None:
        compute_dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    dtype = compute_dtype
    c = cos[:n_pos].to(dtype)
    s = sin[:n_pos].to(dtype)
    if not heads_first:  # [pos, 1, half] broadcasts over the head axis
        c, s = c[:, None, :], s[:, None, :]
    span = x[..., start : start + dim]
    if dtype in (torch.float32, torch.float64):
        table = torch.complex(c, s)
        rotated = torch.view_as_real(_as_complex(span.to(dtype)) * table).flatten(-2).to(out_dtype)
    else:
        x1, x2 = span[..., 0::2].to(dtype), span[..., 1::2].to(dtype)
        rotated = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).to(out_dtype)
    if head_mask is not None:
        mask = head_mask[:, None, None] if heads_first else head_mask[:, None]
        rotated = torch.where(mask, rotated, span.to(out_dtype))
    if start == 0 and dim == x.shape[-1]:
        return rotated
    return torch.cat(
        [x[..., :start].to(out_dtype), rotated, x[..., start + dim :].to(out_dtype)], dim=-1
    )


def _as_complex(span: Tensor) -> Tensor:
    """Adjacent pairs of the last axis as complex numbers (a view when the strides allow)."""
    pairs = span.reshape(*span.shape[:-1], span.shape[-1] // 2, 2)
    try:
        return torch.view_as_complex(pairs)
    except RuntimeError:  # an odd offset or stride: copy first
        return torch.view_as_complex(pairs.contiguous())

"""Relative-bias encodings: a ``[head, q_pos, k_pos]`` term added to the attention logits.

Both bias matrices depend only on ``k_pos - q_pos``, so they are Toeplitz.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Encoding, FusedPE, HeadAxes, ModelShape, check_number
from .spec import register_encoding


def relative_positions(n_q: int, n_k: int, device=None) -> Tensor:
    """``rel[i, j] = j - i`` (key position minus query position)."""
    return torch.arange(n_k, device=device)[None, :] - torch.arange(n_q, device=device)[:, None]


def t5_buckets(rel: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bidirectional log-bucketing of relative positions.

    Half the buckets are for keys after the query, half for keys before it. Within each half, the
    first ``num_buckets // 4`` offsets get a bucket each; larger offsets share logarithmically wider
    buckets up to ``max_distance``, beyond which all offsets share the last bucket.
    """
    half = num_buckets // 2
    bucket = (rel > 0).long() * half
    dist = rel.abs()
    exact = half // 2
    log_ratio = torch.log(dist.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (half - exact)).long()).clamp(max=half - 1)
    return bucket + torch.where(dist < exact, dist, far)


@register_encoding("t5")
class T5Bias(Encoding):
    """A learned bias per head and relative offset, one table per layer (as the authors' code).

    ``buckets=None`` keeps a full table, one entry per offset in ``(-n_ctx, n_ctx)``; an integer
    uses T5's log buckets (``max_distance`` caps the last one).
    """

    kind = "additive"

    def __init__(self, cfg: ModelShape, buckets: int | None = None, max_distance: int = 128):
        super().__init__(cfg)
        if buckets is not None:
            check_number("t5", "buckets", buckets, integer=True)
        check_number("t5", "max_distance", max_distance, integer=True)
        if buckets is not None and (buckets < 4 or buckets % 2):
            raise ValueError(f"t5: buckets must be None or an even integer >= 4, got {buckets}")
        if buckets is not None and max_distance <= buckets // 4:
            raise ValueError(f"t5: max_distance must exceed buckets // 4, got {max_distance}")
        self.buckets, self.max_distance = buckets, max_distance
        n_buckets = 2 * cfg.n_ctx - 1 if buckets is None else buckets
        self.rel_bias = nn.Parameter(torch.zeros(cfg.n_layers, cfg.n_heads, n_buckets))
        rel = relative_positions(cfg.n_ctx, cfg.n_ctx)
        index = rel + (cfg.n_ctx - 1) if buckets is None else t5_buckets(rel, buckets, max_distance)
        self.register_buffer("bucket_index", index, persistent=False)

    def head_parameters(self) -> dict[str, HeadAxes]:
        return {"rel_bias": HeadAxes(head=1, layer=0)}

    def bias(self, n_q: int, n_k: int, layer: int):
        # F.embedding rather than fancy indexing: its CPU backward is deterministic.
        table = self.rel_bias[layer].T  # [bucket, head]
        return F.embedding(self.bucket_index[:n_q, :n_k], table).permute(2, 0, 1)

    def fused(self, layer: int, n_pos: int) -> FusedPE:
        from pe_interp.kernels import RelBiasSpec

        return FusedPE(
            rel_bias=RelBiasSpec(self.rel_bias[layer], self.bucket_index[:n_pos, :n_pos])
        )


def alibi_slopes(n_heads: int, style: str = "standard") -> Tensor:
    """Per-head ALiBi slopes.

    ``standard`` (Press et al.): the geometric sequence ``2^(-8h/n)``, h = 1..n, for a power of two
    n; otherwise those of the nearest lower power of two plus every other slope of the next one.
    ``authors``: ``exp(-h/H)`` for h = 0..H-1, as in the paper's code; much steeper decay for most
    heads, which alone may explain ALiBi failing a task with distances up to 71.
    """
    if style == "authors":
        return torch.exp(-torch.arange(n_heads, dtype=torch.float64) / n_heads).float()

    def geometric(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    p = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


@register_encoding("alibi")
class ALiBi(Encoding):
    """Fixed linear distance penalty ``-m_h |i - j|`` per head (bidirectional form)."""

    kind = "additive"

    def __init__(self, cfg: ModelShape, slopes: str = "standard"):
        super().__init__(cfg)
        if slopes not in ("standard", "authors"):
            raise ValueError(f"alibi: slopes must be 'standard' or 'authors', got {slopes!r}")
        self.slope_style = slopes
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads, slopes), persistent=False)
        self.register_buffer(
            "distance", relative_positions(cfg.n_ctx, cfg.n_ctx).abs().float(), persistent=False
        )

    def bias(self, n_q: int, n_k: int, layer: int):
        return -self.slopes[:, None, None] * self.distance[:n_q, :n_k]

    def fused(self, layer: int, n_pos: int) -> FusedPE:
        return FusedPE(alibi_slopes=self.slopes)

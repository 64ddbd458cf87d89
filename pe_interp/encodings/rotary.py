"""Rotary encodings: queries and keys are rotated by position (multiplicative coupling).

Pair layout, pinned: **adjacent (interleaved) pairs**, as in the authors' code and GPT-J. Pair i
of a rotated span is dims ``(2i, 2i+1)``, rotated by angle ``pos * base^(-2i/dim)``. The logit
between positions m and n then depends on ``(m - n)`` only through these rotations, so for equal
content it is a function of the offset alone (tested). The rotation itself is
:func:`pe_interp.kernels.rope.apply_rope`, shared with the kernel's reference.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pe_interp.kernels.rope import apply_rope, rope_angles, rope_frequencies

from .base import (
    Encoding,
    FusedPE,
    HeadAxes,
    ModelShape,
    RotarySpan,
    check_number,
)
from .spec import register_encoding

__all__ = ["DecoupledRoPE", "RoPE", "apply_rope", "rope_angles"]


def _out_dtype(q: torch.Tensor) -> torch.dtype | None:
    """Under CPU autocast, half-precision q/k leave the rotation in fp32 (where it was computed):
    the attention either runs in fp32 or casts them once (pe_interp.models.hooked.attn_routes)."""
    if (
        q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float16)
        and torch.is_autocast_enabled("cpu")
    ):
        return torch.float32
    return None


@register_encoding("rope")
class RoPE(Encoding):
    """Rotary position embedding (Su et al.).

    - ``base``: frequency base.
    - ``rotary_dim``: rotate only the first ``rotary_dim`` dims of each head (partial by dims).
    - ``heads``: rotate only these head indices (partial by heads, the paper's "RoPE on k heads").
    """

    kind = "multiplicative"

    def __init__(
        self,
        cfg: ModelShape,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        heads: tuple[int, ...] | None = None,
    ):
        super().__init__(cfg)
        check_number("rope", "base", base, above=1)
        if rotary_dim is not None:
            check_number("rope", "rotary_dim", rotary_dim, integer=True)
        if heads is not None and (
            not isinstance(heads, tuple | list)
            or any(isinstance(h, bool) or not isinstance(h, int) for h in heads)
        ):
            raise ValueError(f"rope: heads must be a list of head indices, got {heads!r}")
        dim = cfg.d_head if rotary_dim is None else rotary_dim
        if not (0 < dim <= cfg.d_head) or dim % 2:
            raise ValueError(
                f"rope: rotary_dim must be even and in (0, d_head={cfg.d_head}], got {dim}"
            )
        self.base, self.rotary_dim, self.heads = base, dim, heads
        cos, sin = rope_angles(cfg.n_ctx, dim, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        if heads is None:
            self.head_mask = None
        else:
            bad = [h for h in heads if not 0 <= h < cfg.n_heads]
            if bad or not heads:
                raise ValueError(
                    f"rope: heads must be a non-empty subset of 0..{cfg.n_heads - 1}, got {heads}"
                )
            mask = torch.zeros(cfg.n_heads, dtype=torch.bool)
            mask[list(heads)] = True
            self.register_buffer("head_mask", mask, persistent=False)

    def rotate(self, q, k, layer):
        out = _out_dtype(q)
        return (
            apply_rope(q, self.cos, self.sin, 0, self.head_mask, out_dtype=out),
            apply_rope(k, self.cos, self.sin, 0, self.head_mask, out_dtype=out),
        )

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...]:
        theta = rope_frequencies(self.rotary_dim, self.base)
        return (RotarySpan(0, self.rotary_dim, theta, self.cos, self.sin, self.head_mask),)

    def fused(self, layer: int, n_pos: int) -> FusedPE:
        from pe_interp.kernels import RopeSpec

        return FusedPE(
            rope=RopeSpec(self.cos[:n_pos], self.sin[:n_pos], 0, self.rotary_dim, self.head_mask)
        )


@register_encoding("decoupled_rope")
class DecoupledRoPE(Encoding):
    """MLA-style decoupled RoPE (DeepSeek-V2/V3): content q/k stay un-rotated, and each layer
    appends a ``d_rope``-dim rotated sub-space with its own projections: a query part per head and
    one key part shared by all heads. The logit is ``q_c.k_c + rot(q_r).rot(k_r)`` (hybrid: an
    additive sum of a NoPE path and a multiplicative path), scaled by ``1/sqrt(d_head + d_rope)``.
    """

    kind = "hybrid"

    def __init__(self, cfg: ModelShape, d_rope: int = 8, base: float = 10000.0):
        super().__init__(cfg)
        check_number("decoupled_rope", "d_rope", d_rope, integer=True)
        check_number("decoupled_rope", "base", base, above=1)
        if d_rope <= 0 or d_rope % 2:
            raise ValueError(
                f"decoupled_rope: d_rope must be a positive even integer, got {d_rope}"
            )
        self.d_rope, self.base = d_rope, base
        self.W_QR = nn.Parameter(torch.empty(cfg.n_layers, cfg.d_model, cfg.n_heads, d_rope))
        self.W_KR = nn.Parameter(torch.empty(cfg.n_layers, cfg.d_model, d_rope))
        cos, sin = rope_angles(cfg.n_ctx, d_rope, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def extra_qk_dims(self) -> int:
        return self.d_rope

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...]:
        theta = rope_frequencies(self.d_rope, self.base)
        return (RotarySpan(self.d_head, self.d_rope, theta, self.cos, self.sin),)

    def head_parameters(self) -> dict[str, HeadAxes]:
        return {"W_QR": HeadAxes(head=2, layer=0)}  # W_KR is shared by all heads

    def init_parameters(self, generator: torch.Generator, std: float) -> None:
        if self.init_mode != "torch":
            return super().init_parameters(generator, std)
        bound = 1.0 / math.sqrt(self.d_model)  # nn.Linear(d_model, ...)'s default
        with torch.no_grad():
            for p in (self.W_QR, self.W_KR):
                p.copy_(torch.rand(p.shape, generator=generator) * (2 * bound) - bound)

    def extend(self, x_q, x_kv, q, k, layer):
        # Inputs are [batch, pos, d_model], or per head [batch, pos, head, d_model] (split q/k/v).
        if x_q.ndim == 4:
            q_r = torch.einsum("bphm,mhr->bphr", x_q, self.W_QR[layer])
        else:
            q_r = torch.einsum("bpm,mhr->bphr", x_q, self.W_QR[layer])
        if x_kv.ndim == 4:
            k_r = torch.einsum("bphm,mr->bphr", x_kv, self.W_KR[layer])
        else:
            k_r = (x_kv @ self.W_KR[layer])[:, :, None, :].expand(-1, -1, k.shape[2], -1)
        return torch.cat([q, q_r], dim=-1), torch.cat([k, k_r], dim=-1)

    def rotate(self, q, k, layer):
        start, out = q.shape[-1] - self.d_rope, _out_dtype(q)
        return (
            apply_rope(q, self.cos, self.sin, start, out_dtype=out),
            apply_rope(k, self.cos, self.sin, start, out_dtype=out),
        )

    def fused(self, layer: int, n_pos: int) -> FusedPE:
        from pe_interp.kernels import RopeSpec

        return FusedPE(
            rope=RopeSpec(self.cos[:n_pos], self.sin[:n_pos], self.d_head, self.d_rope, None)
        )

"""Plain-torch attention with the same interface as ``fused_attention`` (materialised scores).

Used as ground truth by the tests (run it in float64) and as the eager baseline of the GPU
benchmark. Differentiable w.r.t. q, k, v and ``rel_bias.table``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rope import apply_rope as rotate
from .specs import RelBiasSpec, RopeSpec, validate_attention_args

__all__ = ["apply_rope", "attention_logits", "reference_attention", "rebuild_pattern"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def apply_rope(x: Tensor, rope: RopeSpec | None) -> Tensor:
    """Rotate interleaved pairs of ``x`` [B, H, S, D] (see :class:`RopeSpec`) with the model's own
    rotation (:func:`pe_interp.kernels.rope.apply_rope`).

    The rotation runs in float32 (float64 for float64 input) and the result is cast back to
    ``x.dtype``, like the kernel does before its matmuls.
    """
    if rope is None:
        return x
    return rotate(
        x,
        rope.cos,
        rope.sin,
        rope.start,
        rope.heads,
        heads_first=True,
        compute_dtype=_compute_dtype(x.dtype),
    )


def allowed_mask(S: int, device, *, causal: bool, key_valid: Tensor | None) -> Tensor:
    """Bool mask, True where key j is visible to query i: ``(key_valid[b, j] or i == j) and
    (not causal or j <= i)``. Shape [B or 1, 1, S, S]."""
    idx = torch.arange(S, device=device)
    allowed = torch.ones(1, 1, S, S, dtype=torch.bool, device=device)
    if key_valid is not None:
        eye = idx[:, None] == idx[None, :]
        allowed = key_valid[:, None, None, :] | eye
    if causal:
        allowed = allowed & (idx[None, :] <= idx[:, None])
    return allowed


def attention_logits(
    q: Tensor,
    k: Tensor,
    *,
    scale: float,
    causal: bool = False,
    key_valid: Tensor | None = None,
    rope: RopeSpec | None = None,
    alibi_slopes: Tensor | None = None,
    rel_bias: RelBiasSpec | None = None,
) -> Tensor:
    """Masked logits [B, H, S, S] in float32 (float64 for float64 input); masked = -inf."""
    S = q.shape[2]
    cdt = _compute_dtype(q.dtype)
    qr, kr = apply_rope(q, rope), apply_rope(k, rope)
    s = torch.matmul(qr, kr.transpose(-1, -2)).to(cdt) * scale
    if alibi_slopes is not None:
        idx = torch.arange(S, device=q.device)
        dist = (idx[:, None] - idx[None, :]).abs().to(cdt)
        s = s - alibi_slopes.to(cdt).view(1, -1, 1, 1) * dist
    if rel_bias is not None:
        s = s + rel_bias.table.to(cdt)[:, rel_bias.buckets.long()].unsqueeze(0)
    allowed = allowed_mask(S, q.device, causal=causal, key_valid=key_valid)
    return s.masked_fill(~allowed, float("-inf"))


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool = False,
    key_valid: Tensor | None = None,
    rope: RopeSpec | None = None,
    alibi_slopes: Tensor | None = None,
    rel_bias: RelBiasSpec | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Eager attention with the semantics of :func:`fused_attention` (no dropout).

    q/k matmul in the input dtype, bias + softmax in float32 (float64 for float64 input),
    probabilities cast to ``v.dtype`` for the value matmul. Returns ``[B, H, S, Dv]`` in the input
    dtype, plus the natural-log LSE ``[B, H, S]`` (compute dtype) when ``return_lse``.
    """
    kw = dict(
        scale=scale,
        causal=causal,
        key_valid=key_valid,
        rope=rope,
        alibi_slopes=alibi_slopes,
        rel_bias=rel_bias,
    )
    validate_attention_args(q, k, v, **kw)
    s = attention_logits(q, k, **kw)
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(p.to(v.dtype), v)
    if return_lse:
        return out, torch.logsumexp(s, dim=-1)
    return out


def rebuild_pattern(
    q: Tensor,
    k: Tensor,
    lse: Tensor,
    *,
    scale: float,
    causal: bool = False,
    key_valid: Tensor | None = None,
    rope: RopeSpec | None = None,
    alibi_slopes: Tensor | None = None,
    rel_bias: RelBiasSpec | None = None,
) -> Tensor:
    """Attention probabilities [B, H, S, S] from q, k and the LSE returned by the forward.

    ``exp(logit - lse)``: equals the softmax of the forward without a second reduction, so a
    caller can slice q/k/lse to one head (or a few query rows) and rebuild just that pattern.
    Plain torch; returned in float32 (float64 if ``lse`` is float64).
    """
    if lse.shape != q.shape[:3]:
        raise ValueError(
            f"attention: lse must be [B, H, S] = {tuple(q.shape[:3])}, got {tuple(lse.shape)}"
        )
    kw = dict(
        scale=scale,
        causal=causal,
        key_valid=key_valid,
        rope=rope,
        alibi_slopes=alibi_slopes,
        rel_bias=rel_bias,
    )
    validate_attention_args(q, k, k, **kw)
    s = attention_logits(q, k, **kw)
    cdt = torch.float64 if lse.dtype == torch.float64 else torch.float32
    return torch.exp(s.to(cdt) - lse.to(cdt).unsqueeze(-1))

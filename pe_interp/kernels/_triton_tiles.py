"""The shared Triton tile helpers of the fused attention kernels (imported lazily, with them).

Constants of the exp2-domain softmax, the fp32-accumulating dot, RoPE applied to a q/k tile as it
is loaded (and its transpose on a gradient tile), the position biases and mask of a score tile, and
``_rope_rotate``, the one-pass rotation the backward uses instead of rotating on load. The kernels
themselves are in :mod:`pe_interp.kernels._triton_flash` (forward) and
:mod:`pe_interp.kernels._triton_bwd` (backward).
"""

from __future__ import annotations

import triton
import triton.language as tl

from pe_interp.kernels._triton_interpreter import INTERPRET, INTERPRETER_INDEX_FIX  # noqa: F401 - before any kernel

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity" for the running max


@triton.jit
def _dot(a, b, DOT_PREC: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """tl.dot with fp32 accumulation. DOT_UPCAST (interpreter + bf16 only) feeds the operands as
    fp32: the interpreter multiplies raw bf16 bit patterns (triton-lang/triton#11584); bf16
    products are exact in fp32, so this matches the GPU's bf16 MMA up to summation order."""
    if DOT_UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=DOT_PREC)


@triton.jit
def _rope_coeffs(pos, d, S, rope_start, rope_dim, rot_on, COS, SIN, s_cs):
    """cos / signed sin for a [len(pos), len(d)] tile, plus the in-rope mask and partner dims.

    ``x'[d] = x[d] * c[d] + x[partner(d)] * s[d]`` where s = -sin on the even dim of a pair and
    +sin on the odd one; dims outside the rotated range (or on unrotated heads) get c=1, s=0.
    """
    rel = d - rope_start
    in_r = (rel >= 0) & (rel < rope_dim) & (rot_on != 0)
    odd = (rel % 2) != 0
    partner = tl.where(in_r, tl.where(odd, d - 1, d + 1), d)
    pair = tl.where(in_r, rel // 2, 0)
    m2 = (pos < S)[:, None] & in_r[None, :]
    off = pos[:, None] * s_cs + pair[None, :]
    c = tl.load(COS + off, mask=m2, other=1.0)
    s = tl.load(SIN + off, mask=m2, other=0.0)
    s = tl.where(odd[None, :], s, -s)
    return in_r, partner, c, s


@triton.jit
def _load_qk_tile(
    BASE,
    pos,
    d,
    s_s,
    s_d,
    S,
    D,
    rot_on,
    rope_start,
    rope_dim,
    COS,
    SIN,
    s_cs,
    HAS_ROPE: tl.constexpr,
):
    """Load a [len(pos), len(d)] q or k tile (zero padded), rotated if HAS_ROPE, in input dtype."""
    pmask = (pos < S)[:, None]
    x = tl.load(
        BASE + pos[:, None] * s_s + d[None, :] * s_d, mask=pmask & (d < D)[None, :], other=0.0
    )
    if HAS_ROPE:
        in_r, partner, c, s = _rope_coeffs(pos, d, S, rope_start, rope_dim, rot_on, COS, SIN, s_cs)
        xp = tl.load(
            BASE + pos[:, None] * s_s + partner[None, :] * s_d,
            mask=pmask & in_r[None, :],
            other=0.0,
        )
        x = (x.to(tl.float32) * c + xp.to(tl.float32) * s).to(x.dtype)
    return x


@triton.jit
def _unrotate(g, pos, d, S, rot_on, rope_start, rope_dim, COS, SIN, s_cs):
    """Transpose rotation of a rotated-space gradient tile g (fp32): g[d]*c - g[partner]*s."""
    in_r, partner, c, s = _rope_coeffs(pos, d, S, rope_start, rope_dim, rot_on, COS, SIN, s_cs)
    idx = tl.broadcast_to(partner[None, :], g.shape)
    gp = tl.gather(g, idx, axis=1)
    return g * c - gp * s


@triton.jit
def _bias_and_mask(
    s,
    i2,
    j2,
    b,
    h,
    S,
    KV,
    s_kvb,
    slope,
    TABLE,
    s_th,
    BUCKETS,
    s_bi,
    CAUSAL: tl.constexpr,
    HAS_KV: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_REL: tl.constexpr,
):
    """Add position biases (log2 units; host pre-multiplies slopes/table by log2 e) and apply
    the mask. i2 / j2 are broadcastable 2-D query / key index tensors (either orientation)."""
    valid = (i2 < S) & (j2 < S)
    if HAS_ALIBI:
        s = s - slope * tl.abs(i2 - j2).to(tl.float32)
    if HAS_REL:
        bk = tl.load(BUCKETS + i2 * s_bi + j2, mask=valid, other=0).to(tl.int32)
        s = s + tl.load(TABLE + h * s_th + bk, mask=valid, other=0.0)
    allowed = valid
    if HAS_KV:
        kv = tl.load(KV + b * s_kvb + j2, mask=j2 < S, other=0)
        allowed = allowed & ((kv != 0) | (i2 == j2))
    if CAUSAL:
        allowed = allowed & (j2 <= i2)
    return tl.where(allowed, s, float("-inf"))


@triton.jit
def _rope_rotate(
    X,
    Y,
    COS,
    SIN,
    HEADS,
    s_xb,
    s_xh,
    s_xs,
    s_xd,
    s_yb,
    s_yh,
    s_ys,
    s_yd,
    s_cs,
    S,
    D,
    rope_start,
    rope_dim,
    HAS_HEADS: tl.constexpr,
    BLOCK: tl.constexpr,
    D_P: tl.constexpr,
):
    """Y = rot(X) for a [BLOCK, D] tile per program (same rounding as the on-load rotation).

    Used by the backward to rotate q and k once instead of in every inner-loop iteration,
    which keeps the backward kernels' register pressure at the level of plain attention."""
    pid = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    pos = pid * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, D_P)
    rot_on = 1
    if HAS_HEADS:
        rot_on = tl.load(HEADS + h).to(tl.int32)
    x = _load_qk_tile(
        X + b * s_xb + h * s_xh,
        pos,
        d,
        s_xs,
        s_xd,
        S,
        D,
        rot_on,
        rope_start,
        rope_dim,
        COS,
        SIN,
        s_cs,
        True,
    )
    tl.store(
        Y + b * s_yb + h * s_yh + pos[:, None] * s_ys + d[None, :] * s_yd,
        x,
        mask=(pos < S)[:, None] & (d < D)[None, :],
    )

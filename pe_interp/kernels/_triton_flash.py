"""Triton kernels for fused attention with positional encodings (imported lazily).

This module imports Triton at import time and decorates the kernels then, so it is only
imported on the first call of ``fused_attention`` (``pe_interp.kernels.flash``). Triton reads
``TRITON_INTERPRET`` when ``@triton.jit`` runs, i.e. when this module is first imported: set it
before the first ``fused_attention`` call to run the kernels on CPU tensors with the interpreter.

Layout of the work (FlashAttention-2 style):

* forward: one program per (query block, head, batch); streams key blocks, online softmax in the
  exp2 domain, writes O and the natural-log LSE.
* backward: ``_attn_bwd_dkdv`` (one program per key block; loops over query blocks) and
  ``_attn_bwd_dq`` (one program per query block; loops over key blocks), both recomputing P from
  the saved LSE. ``delta = rowsum(dO * O)`` is computed by the host in torch. The dq kernel also
  emits dBias[h, i, j] = sum_b dS[b, h, i, j] for the relative-bias table.

RoPE is applied to q/k tiles as they are loaded: each tile is loaded twice, once normally and
once with the columns permuted to the pair partner (``d -> d +- 1``), and combined with
cos/sin gathered from the angle table: ``x' = x * c + x[partner] * s_signed``. The forward always
does this. The backward by default (``flash.BWD_PREROTATE``) rotates q and k once with
``_rope_rotate`` (identical arithmetic and rounding) so its inner loops stay as light as plain
attention; it can also rotate on load (``HAS_ROPE`` in the backward kernels). Either way the
rotated-space gradients dq/dk are un-rotated in the backward kernels' epilogue with the transpose
rotation, using ``tl.gather`` on the fp32 accumulator to fetch the partner column.

Masking: key j is visible to query i iff ``(key_valid[b, j] or i == j) and (not causal or
j <= i)``, plus bounds; masked logits are -inf. Causal programs also skip whole blocks above the
diagonal. The running max starts at a finite -1e30, so fully masked blocks (and padded rows past
S, which are never stored) produce zeros instead of NaNs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pe_interp.kernels._triton_bwd import _attn_bwd_dkdv, _attn_bwd_dq
from pe_interp.kernels._triton_interpreter import INTERPRET, INTERPRETER_INDEX_FIX  # noqa: F401 - before any kernel
from pe_interp.kernels._triton_tiles import (
    LN2,
    NEG_BIG,
    _bias_and_mask,
    _dot,
    _load_qk_tile,
    _rope_rotate,
)

__all__ = ["INTERPRET", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_fwd", "_rope_rotate"]


@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    OUT,
    LSE,
    KV,
    COS,
    SIN,
    HEADS,
    SLOPES,
    TABLE,
    BUCKETS,
    s_qb,
    s_qh,
    s_qs,
    s_qd,
    s_kb,
    s_kh,
    s_ks,
    s_kd,
    s_vb,
    s_vh,
    s_vs,
    s_vd,
    s_ob,
    s_oh,
    s_os,
    s_od,
    s_kvb,
    s_cs,
    s_th,
    s_bi,
    H,
    S,
    DQK,
    DV,
    rope_start,
    rope_dim,
    qk_scale,
    CAUSAL: tl.constexpr,
    HAS_KV: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    HAS_HEADS: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_REL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DQK_P: tl.constexpr,
    DV_P: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    dqk = tl.arange(0, DQK_P)
    dv = tl.arange(0, DV_P)
    Qb = Q + b * s_qb + h * s_qh
    Kb = K + b * s_kb + h * s_kh
    Vb = V + b * s_vb + h * s_vh

    rot_on = 1
    if HAS_HEADS:
        rot_on = tl.load(HEADS + h).to(tl.int32)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + h)

    q = _load_qk_tile(
        Qb, offs_m, dqk, s_qs, s_qd, S, DQK, rot_on, rope_start, rope_dim, COS, SIN, s_cs, HAS_ROPE
    )

    m_i = tl.full([BLOCK_M], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_P], tl.float32)

    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = _load_qk_tile(
            Kb,
            offs_n,
            dqk,
            s_ks,
            s_kd,
            S,
            DQK,
            rot_on,
            rope_start,
            rope_dim,
            COS,
            SIN,
            s_cs,
            HAS_ROPE,
        )
        v = tl.load(
            Vb + offs_n[:, None] * s_vs + dv[None, :] * s_vd,
            mask=(offs_n < S)[:, None] & (dv < DV)[None, :],
            other=0.0,
        )
        qk = _dot(q, tl.trans(k), DOT_PREC, DOT_UPCAST) * qk_scale
        qk = _bias_and_mask(
            qk,
            offs_m[:, None],
            offs_n[None, :],
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
            CAUSAL,
            HAS_KV,
            HAS_ALIBI,
            HAS_REL,
        )
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PREC, DOT_UPCAST)
        m_i = m_new

    # Every real row sees at least itself, so l_i > 0 there; the guard only covers padded rows.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    rmask = offs_m < S
    tl.store(
        OUT + b * s_ob + h * s_oh + offs_m[:, None] * s_os + dv[None, :] * s_od,
        out.to(OUT.dtype.element_ty),
        mask=rmask[:, None] & (dv < DV)[None, :],
    )
    lse = (m_i + tl.math.log2(l_safe)) * LN2
    tl.store(LSE + (b * H + h) * S + offs_m, lse, mask=rmask)

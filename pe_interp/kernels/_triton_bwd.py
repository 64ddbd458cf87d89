"""The backward kernels of fused attention (imported lazily, with :mod:`._triton_flash`).

``_attn_bwd_dkdv``: one program per key block, looping over query blocks; ``_attn_bwd_dq``: one
program per query block, looping over key blocks, which also emits dBias[h, i, j] = sum_b
dS[b, h, i, j] for the relative-bias table. Both recompute P from the saved LSE; the rotated-space
gradients dq/dk are un-rotated in their epilogue. The layout is described in
:mod:`pe_interp.kernels._triton_flash`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pe_interp.kernels._triton_interpreter import INTERPRET, INTERPRETER_INDEX_FIX  # noqa: F401 - before any kernel
from pe_interp.kernels._triton_tiles import LOG2E, _bias_and_mask, _dot, _load_qk_tile, _unrotate


@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DVG,
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
    s_dob,
    s_doh,
    s_dos,
    s_dod,
    s_dkb,
    s_dkh,
    s_dks,
    s_dkd,
    s_dvb,
    s_dvh,
    s_dvs,
    s_dvd,
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
    sm_scale,
    CAUSAL: tl.constexpr,
    HAS_KV: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    HAS_HEADS: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_REL: tl.constexpr,
    UNROTATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DQK_P: tl.constexpr,
    DV_P: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """One program per key block: dK, dV by streaming query blocks (transposed scores)."""
    pid_n = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    dqk = tl.arange(0, DQK_P)
    dv = tl.arange(0, DV_P)
    Qb = Q + b * s_qb + h * s_qh
    DOb = DO + b * s_dob + h * s_doh
    row = (b * H + h) * S

    rot_on = 1
    if HAS_HEADS:
        rot_on = tl.load(HEADS + h).to(tl.int32)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + h)

    nmask = offs_n < S
    k = _load_qk_tile(
        K + b * s_kb + h * s_kh,
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
        V + b * s_vb + h * s_vh + offs_n[:, None] * s_vs + dv[None, :] * s_vd,
        mask=nmask[:, None] & (dv < DV)[None, :],
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, DQK_P], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, DV_P], tl.float32)

    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(lo, S, BLOCK_M):
        offs_m = start_m + offs_m0
        mmask = offs_m < S
        q = _load_qk_tile(
            Qb,
            offs_m,
            dqk,
            s_qs,
            s_qd,
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
        do = tl.load(
            DOb + offs_m[:, None] * s_dos + dv[None, :] * s_dod,
            mask=mmask[:, None] & (dv < DV)[None, :],
            other=0.0,
        )
        lse2 = tl.load(LSE + row + offs_m, mask=mmask, other=0.0) * LOG2E
        delta = tl.load(DELTA + row + offs_m, mask=mmask, other=0.0)
        qkT = _dot(k, tl.trans(q), DOT_PREC, DOT_UPCAST) * qk_scale
        qkT = _bias_and_mask(
            qkT,
            offs_m[None, :],
            offs_n[:, None],
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
        pT = tl.math.exp2(qkT - lse2[None, :])
        dv_acc += _dot(pT.to(do.dtype), do, DOT_PREC, DOT_UPCAST)
        dpT = _dot(v, tl.trans(do), DOT_PREC, DOT_UPCAST)
        dsT = pT * (dpT - delta[None, :])
        dk += _dot(dsT.to(q.dtype), q, DOT_PREC, DOT_UPCAST)

    if UNROTATE:
        dk = _unrotate(dk, offs_n, dqk, S, rot_on, rope_start, rope_dim, COS, SIN, s_cs)
    dk = dk * sm_scale
    tl.store(
        DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dks + dqk[None, :] * s_dkd,
        dk.to(DK.dtype.element_ty),
        mask=nmask[:, None] & (dqk < DQK)[None, :],
    )
    tl.store(
        DVG + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvs + dv[None, :] * s_dvd,
        dv_acc.to(DVG.dtype.element_ty),
        mask=nmask[:, None] & (dv < DV)[None, :],
    )


@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    DBIAS,
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
    s_dob,
    s_doh,
    s_dos,
    s_dod,
    s_dqb,
    s_dqh,
    s_dqs,
    s_dqd,
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
    sm_scale,
    CAUSAL: tl.constexpr,
    HAS_KV: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    HAS_HEADS: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_REL: tl.constexpr,
    UNROTATE: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    BIAS_ATOMIC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DQK_P: tl.constexpr,
    DV_P: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """One program per query block: dQ by streaming key blocks; optionally dBias[h, i, j]
    (summed over the batch: fp32 atomics when B > 1, plain stores when B == 1)."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    dqk = tl.arange(0, DQK_P)
    dv = tl.arange(0, DV_P)
    Kb = K + b * s_kb + h * s_kh
    Vb = V + b * s_vb + h * s_vh
    row = (b * H + h) * S

    rot_on = 1
    if HAS_HEADS:
        rot_on = tl.load(HEADS + h).to(tl.int32)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + h)

    mmask = offs_m < S
    q = _load_qk_tile(
        Q + b * s_qb + h * s_qh,
        offs_m,
        dqk,
        s_qs,
        s_qd,
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
    do = tl.load(
        DO + b * s_dob + h * s_doh + offs_m[:, None] * s_dos + dv[None, :] * s_dod,
        mask=mmask[:, None] & (dv < DV)[None, :],
        other=0.0,
    )
    lse2 = tl.load(LSE + row + offs_m, mask=mmask, other=0.0) * LOG2E
    delta = tl.load(DELTA + row + offs_m, mask=mmask, other=0.0)
    dq = tl.zeros([BLOCK_M, DQK_P], tl.float32)
    DBh = DBIAS + h * S * S

    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        nmask = offs_n < S
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
            mask=nmask[:, None] & (dv < DV)[None, :],
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
        p = tl.math.exp2(qk - lse2[:, None])
        dp = _dot(do, tl.trans(v), DOT_PREC, DOT_UPCAST)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, DOT_PREC, DOT_UPCAST)
        if BIAS_GRAD:
            bptr = DBh + offs_m[:, None] * S + offs_n[None, :]
            bmask = mmask[:, None] & nmask[None, :]
            if BIAS_ATOMIC:
                tl.atomic_add(bptr, ds, mask=bmask, sem="relaxed")
            else:
                tl.store(bptr, ds, mask=bmask)

    if UNROTATE:
        dq = _unrotate(dq, offs_m, dqk, S, rot_on, rope_start, rope_dim, COS, SIN, s_cs)
    dq = dq * sm_scale
    tl.store(
        DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqs + dqk[None, :] * s_dqd,
        dq.to(DQ.dtype.element_ty),
        mask=mmask[:, None] & (dqk < DQK)[None, :],
    )

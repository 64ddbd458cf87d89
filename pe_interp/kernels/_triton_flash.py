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

"""Fused (flash) attention with positional encodings inside the kernel, forward and backward.

Public entry point: :func:`fused_attention`. Triton is imported lazily on the first call (see
``_triton_flash``), so importing this module never touches a GPU driver.

No attention dropout: the kernel is deterministic in the forward; the model selects another
backend when attention dropout is on.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .launch import INTERPRET_CONFIG, _next_pow2, _Prepared, rotate_block, triton_cdiv
from .specs import KERNEL_DTYPES, MAX_HEAD_DIM, RelBiasSpec, RopeSpec, validate_attention_args

__all__ = ["TritonUnavailableError", "fused_attention", "triton_available"]

_LOG2E = 1.4426950408889634

#: Test hook: fill outputs / gradient buffers with NaN before the kernels run so that any
#: element the kernels fail to write shows up.
POISON_OUTPUTS = False

#: Backward: rotate q and k once with a small pre-pass (``_rope_rotate``) instead of on every
#: inner-loop load. Same rounding as the forward's on-load rotation; the rotated-space dq/dk are
#: still un-rotated inside the backward kernels. Costs two [B, H, S, Dqk] temporaries but removes
#: the partner loads and cos/sin gathers from the backward inner loops (ptxas showed register
#: spills there with the on-load rotation). False = rotate on load in the backward too.
BWD_PREROTATE = True


class TritonUnavailableError(ImportError):
    """Raised by :func:`fused_attention` when Triton is not installed."""


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when Triton can be imported (does not initialise any GPU driver)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _kernels():
    """Import (and thereby ``@triton.jit``-decorate) the kernels on first use."""
    if not triton_available():
        raise TritonUnavailableError(
            "fused_attention needs Triton (`pip install 'pe-interp[triton]'`); "
            "use reference_attention or torch's scaled_dot_product_attention instead."
        )
    from . import _triton_flash

    return _triton_flash


def _alloc(shape, dtype, device) -> Tensor:
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _alloc_like(t: Tensor) -> Tensor:
    out = torch.empty_like(t)  # keeps the (dense) strides of t, e.g. transposed [B, S, H, D]
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _strides(t: Tensor) -> list[int]:
    return list(t.stride())


def _fwd(q: Tensor, k: Tensor, v: Tensor, table2: Tensor | None, pp: _Prepared):
    kern = _kernels()
    B, H, S, Dqk = q.shape
    Dv = v.shape[-1]
    # [B, S, H, Dv] memory, returned as a [B, H, S, Dv] view: the caller's transpose back is free.
    o = _alloc((B, S, H, Dv), q.dtype, q.device).transpose(1, 2)
    lse = _alloc((B, H, S), torch.float32, q.device)
    cfg = pp.config("fwd")
    tensors, strides = pp.common_args(table2)
    grid = (triton_cdiv(S, cfg["BLOCK_M"]), H, B)
    kern._attn_fwd[grid](
        q,
        k,
        v,
        o,
        lse,
        *tensors,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(o),
        *strides,
        H,
        S,
        Dqk,
        Dv,
        pp.rope_start,
        pp.rope_dim,
        pp.scale * _LOG2E,
        **pp.flags(table2 is not None),
        **cfg,
    )
    return o, lse


def _bwd(q, k, v, o, lse, do, table2, pp: _Prepared, want_table_grad: bool):
    kern = _kernels()
    B, H, S, Dqk = q.shape
    Dv = v.shape[-1]
    delta = (do.float() * o.float()).sum(-1).contiguous()  # [B, H, S] = rowsum(dO * O)
    dq, dk, dv = _alloc_like(q), _alloc_like(k), _alloc_like(v)
    tensors, strides = pp.common_args(table2)
    flags = pp.flags(table2 is not None)
    flags["UNROTATE"] = flags["HAS_ROPE"]
    if flags["HAS_ROPE"] and pp.bwd_prerotate:
        q, k = _rotate(q, pp), _rotate(k, pp)
        flags["HAS_ROPE"] = False
    scalars = (H, S, Dqk, Dv, pp.rope_start, pp.rope_dim, pp.scale * _LOG2E, pp.scale)

    cfg = pp.config("dkdv")
    grid = (triton_cdiv(S, cfg["BLOCK_N"]), H, B)
    kern._attn_bwd_dkdv[grid](
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        *tensors,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(do),
        *_strides(dk),
        *_strides(dv),
        *strides,
        *scalars,
        **flags,
        **cfg,
    )

    bias_grad = want_table_grad and table2 is not None
    # dBias[h, i, j] summed over the batch; zero-filled because causal programs skip blocks.
    dbias = torch.zeros(H, S, S, dtype=torch.float32, device=q.device) if bias_grad else pp.dummy
    cfg = pp.config("dq")
    grid = (triton_cdiv(S, cfg["BLOCK_M"]), H, B)
    kern._attn_bwd_dq[grid](
        q,
        k,
        v,
        do,
        lse,
        delta,
        dq,
        dbias,
        *tensors,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(do),
        *_strides(dq),
        *strides,
        *scalars,
        **flags,
        BIAS_GRAD=bias_grad,
        BIAS_ATOMIC=B > 1,
        **cfg,
    )
    dtable = None
    if bias_grad:
        idx = pp.buckets_long.view(1, -1).expand(H, -1)
        dtable = torch.zeros(H, pp.num_buckets, dtype=torch.float32, device=q.device)
        dtable.scatter_add_(1, idx, dbias.view(H, S * S))
    return dq, dk, dv, dtable


def _rotate(x: Tensor, pp: _Prepared) -> Tensor:
    """RoPE-rotated copy of x [B, H, S, D] (contiguous), via the Triton pre-pass."""
    kern = _kernels()
    B, H, S, D = x.shape
    y = torch.empty((B, H, S, D), dtype=x.dtype, device=x.device)
    block = INTERPRET_CONFIG["fwd"]["BLOCK_M"] if pp.interpret else rotate_block(_next_pow2(D))
    grid = (triton_cdiv(S, block), H, B)
    kern._rope_rotate[grid](
        x,
        y,
        pp.cos,
        pp.sin,
        pp.ptr(pp.heads),
        *_strides(x),
        *_strides(y),
        pp.cos.stride(0),
        S,
        D,
        pp.rope_start,
        pp.rope_dim,
        HAS_HEADS=pp.heads is not None,
        BLOCK=block,
        D_P=_next_pow2(D),
        num_warps=4,
    )
    return y


class _FusedAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, pp: _Prepared):
        table2 = None
        if table is not None:
            table2 = (table.detach().float() * _LOG2E).contiguous()
        o, lse = _fwd(q, k, v, table2, pp)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.pp = pp
        ctx.table2 = table2
        ctx.table_dtype = table.dtype if table is not None else None
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        want_table = ctx.table2 is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dtable = _bwd(q, k, v, o, lse, do, ctx.table2, ctx.pp, want_table)
        if dtable is not None:
            dtable = dtable.to(ctx.table_dtype)
        return dq, dk, dv, dtable, None


def _prepare(q, v, scale, causal, key_valid, rope, alibi_slopes, rel_bias, interpret) -> _Prepared:
    dev = q.device
    S = q.shape[2]
    fp32 = q.dtype == torch.float32
    if fp32:
        # fp32 inputs: ~fp32-accurate tensor-core dots (3 TF32 products per dot) unless the user
        # opted into plain TF32 matmuls globally. ("ieee" would fall back to FMA loops that
        # spill badly.) The interpreter always computes exact fp32 matmuls.
        dot_prec = "tf32" if torch.get_float32_matmul_precision() != "highest" else "tf32x3"
    else:
        dot_prec = "tf32"  # ignored for bf16 / fp16 operands
    pp = _Prepared(
        scale=float(scale),
        causal=bool(causal),
        dqk_p=_next_pow2(q.shape[-1]),
        dv_p=_next_pow2(v.shape[-1]),
        dot_prec=dot_prec,
        fp32=fp32,
        interpret=interpret,
        dot_upcast=interpret and q.dtype == torch.bfloat16,
        bwd_prerotate=BWD_PREROTATE,
        dummy=torch.zeros(1, dtype=torch.float32, device=dev),
        kv=None,
        cos=None,
        sin=None,
        rope_start=0,
        rope_dim=0,
        heads=None,
        slopes2=None,
        buckets=None,
        buckets_long=None,
        num_buckets=0,
    )
    if key_valid is not None:
        pp.kv = key_valid.to(torch.uint8).contiguous()
    if rope is not None:
        pp.cos = rope.cos.detach()[:S].float().contiguous()
        pp.sin = rope.sin.detach()[:S].float().contiguous()
        pp.rope_start, pp.rope_dim = rope.start, rope.dim
        if rope.heads is not None:
            pp.heads = rope.heads.to(torch.uint8).contiguous()
    if alibi_slopes is not None:
        pp.slopes2 = (alibi_slopes.detach().float() * _LOG2E).contiguous()
    if rel_bias is not None:
        nb = rel_bias.table.shape[1]
        pp.num_buckets = nb
        # Narrow bucket ids: the kernels read one id per (i, j) pair per (b, h), so bytes matter.
        small = torch.uint8 if nb <= 256 else torch.int32
        pp.buckets = rel_bias.buckets.to(small).contiguous()
        pp.buckets_long = rel_bias.buckets.reshape(-1).long()
    return pp


def fused_attention(
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
    """Flash attention (Triton) with the positional encoding fused into the kernel.

    Args:
        q, k: ``[B, H, S, Dqk]``; v: ``[B, H, S, Dv]``; any strides (e.g. ``x.transpose(1, 2)``
            views of ``[B, S, H, D]`` tensors). float32 / bfloat16 / float16, head dims <= 128
            (padded to the next power of two inside the kernel); float32 accumulation.
        scale: logit scale (e.g. ``Dqk ** -0.5``).
        causal: queries only see keys ``j <= i``.
        key_valid: Bool ``[B, S]``, True for real tokens. Key j is visible to query i iff
            ``(key_valid[b, j] or i == j) and (not causal or j <= i)``: a query always sees
            itself, so no row is empty.
        rope: interleaved-pair RoPE applied to q and k as they are loaded (see RopeSpec).
        alibi_slopes: Float ``[H]``; adds ``-slope[h] * |i - j|``.
        rel_bias: learned table bias ``table[h, buckets[i, j]]``; ``table`` receives a gradient.
        return_lse: also return the natural-log log-sum-exp ``[B, H, S]`` (float32) of each
            row, for :func:`rebuild_pattern`. The LSE is not differentiable.

    Returns ``[B, H, S, Dv]`` in the input dtype (memory laid out as ``[B, S, H, Dv]``).
    Gradients flow to q, k, v and ``rel_bias.table`` (not to cos/sin/slopes/buckets).

    There is **no attention dropout** in this kernel; callers that need it must use another
    backend. CPU tensors run only under the Triton interpreter (``TRITON_INTERPRET=1`` set
    before the first call); bucket ranges are only checked for CPU tensors.
    """
    validate_attention_args(
        q,
        k,
        v,
        scale=scale,
        causal=causal,
        key_valid=key_valid,
        rope=rope,
        alibi_slopes=alibi_slopes,
        rel_bias=rel_bias,
        dtypes=KERNEL_DTYPES,
        max_head_dim=MAX_HEAD_DIM,
    )
    kern = _kernels()
    if q.device.type == "cpu":
        if not kern.INTERPRET:
            raise ValueError(
                "fused_attention got CPU tensors but the Triton kernels were compiled for GPU: "
                "set TRITON_INTERPRET=1 before the first fused_attention call to use the "
                "(slow) interpreter, or move the tensors to CUDA."
            )
    elif q.device.type != "cuda":
        raise ValueError(
            f"fused_attention supports CUDA tensors (or CPU under the interpreter), got {q.device}"
        )
    pp = _prepare(q, v, scale, causal, key_valid, rope, alibi_slopes, rel_bias, kern.INTERPRET)
    table = rel_bias.table if rel_bias is not None else None
    o, lse = _FusedAttentionFn.apply(q, k, v, table, pp)
    if return_lse:
        return o, lse
    return o

"""Fused (flash) attention with positional encodings inside the kernel, forward and backward.

Public entry point: :func:`fused_attention`. Triton is imported lazily on the first call (see
``_triton_flash``), so importing this module never touches a GPU driver.

No attention dropout: the kernel is deterministic in the forward; the model selects another
backend when attention dropout is on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

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

#: Block configs for the interpreter (CPU tensors): small, so tests cover several blocks and
#: ragged tails while staying cheap (the interpreter costs per program instance and per op).
INTERPRET_CONFIG = {
    "fwd": dict(BLOCK_M=8, BLOCK_N=8, num_warps=1, num_stages=1),
    "dkdv": dict(BLOCK_M=8, BLOCK_N=8, num_warps=1, num_stages=1),
    "dq": dict(BLOCK_M=8, BLOCK_N=8, num_warps=1, num_stages=1),
}


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


def _next_pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def gpu_config(
    kind: str, dqk_p: int, dv_p: int, *, fp32: bool = False, heavy: bool = False
) -> dict[str, int]:
    """Block sizes / warps / stages on GPU (heuristics, not autotuned).

    Chosen by compiling every variant for sm_90 on a CPU box and reading ptxas's register /
    spill / shared-memory report (no GPU was available to time them): configs below have no or
    tiny spills and fit Hopper's 227 KB of shared memory. ``heavy``: RoPE or a bias table is
    fused into the forward (extra gathered tiles per key block). ``fp32``: tf32x3 dots, whose
    split operands triple the shared-memory footprint, so one pipeline stage.
    ``kind``: "fwd" | "dkdv" (BLOCK_N keys per program, BLOCK_M query rows streamed) | "dq".
    """
    d = max(dqk_p, dv_p)
    if fp32:
        w, st = (4, 2) if d <= 32 else ((4, 1) if d <= 64 else (8, 1))
        bm, bn = {"fwd": (64, 32), "dkdv": (32, 64), "dq": (64, 32)}[kind]
    elif kind == "fwd":
        if d <= 32:
            bm, bn, w, st = 64, 64, 4, 2 if heavy else 3
        elif d <= 64:
            bm, bn, w, st = 128, 64, 8, 2 if heavy else 3
        else:
            bm, bn, w, st = 128, 32, 8, 2
    elif kind == "dkdv":
        bm, bn, w, st = (
            (32, 128, 4, 2) if d <= 32 else ((32, 64, 4, 2) if d <= 64 else (32, 64, 8, 2))
        )
    elif kind == "dq":
        bm, bn, w, st = (64, 32, 4, 2) if d <= 64 else (64, 32, 8, 2)
    else:
        raise KeyError(kind)
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)


@dataclass
class _Prepared:
    """Kernel-side view of the non-differentiable inputs (built once per call)."""

    scale: float
    causal: bool
    dqk_p: int
    dv_p: int
    dot_prec: str
    fp32: bool
    dot_upcast: bool
    interpret: bool
    bwd_prerotate: bool
    dummy: Tensor
    kv: Tensor | None  # uint8 [B, S]
    cos: Tensor | None  # fp32 [S_table, R/2] contiguous
    sin: Tensor | None
    rope_start: int
    rope_dim: int
    heads: Tensor | None  # uint8 [H]
    slopes2: Tensor | None  # fp32 [H], pre-multiplied by log2(e)
    buckets: Tensor | None  # uint8 / int32 [S, S] contiguous
    buckets_long: Tensor | None  # int64 [S*S] for the table-gradient scatter
    num_buckets: int

    def ptr(self, t: Tensor | None) -> Tensor:
        return self.dummy if t is None else t

    def common_args(self, table2: Tensor | None) -> tuple[list[Any], list[Any]]:
        tensors = [
            self.ptr(self.kv),
            self.ptr(self.cos),
            self.ptr(self.sin),
            self.ptr(self.heads),
            self.ptr(self.slopes2),
            self.ptr(table2),
            self.ptr(self.buckets),
        ]
        strides = [
            self.kv.stride(0) if self.kv is not None else 0,
            self.cos.stride(0) if self.cos is not None else 0,
            table2.stride(0) if table2 is not None else 0,
            self.buckets.stride(0) if self.buckets is not None else 0,
        ]
        return tensors, strides

    def flags(self, has_rel: bool) -> dict[str, Any]:
        return dict(
            CAUSAL=self.causal,
            HAS_KV=self.kv is not None,
            HAS_ROPE=self.cos is not None,
            HAS_HEADS=self.heads is not None,
            HAS_ALIBI=self.slopes2 is not None,
            HAS_REL=has_rel,
            DQK_P=self.dqk_p,
            DV_P=self.dv_p,
            DOT_PREC=self.dot_prec,
            DOT_UPCAST=self.dot_upcast,
        )

    def config(self, kind: str) -> dict[str, int]:
        if self.interpret:
            return dict(INTERPRET_CONFIG[kind])
        heavy = self.cos is not None or self.buckets is not None
        return gpu_config(kind, self.dqk_p, self.dv_p, fp32=self.fp32, heavy=heavy)


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


def rotate_block(d_p: int) -> int:
    """Rows per program of the backward's RoPE pre-pass on GPU (4 gathered [rows, D] tiles)."""
    return 64 if d_p <= 64 else 32


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


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

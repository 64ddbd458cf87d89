"""Launch geometry of the fused attention kernels: block sizes, grids, and the prepared inputs.

The block configs (small ones for the interpreter, ptxas-read heuristics for GPUs), the padding of
head dims to a power of two, the grid arithmetic, and :class:`_Prepared`, the kernel-side view of a
call's non-differentiable inputs (mask, RoPE tables, slopes, bucket ids) with the pointer, stride and
flag arguments every kernel launch in :mod:`pe_interp.kernels.flash` shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

#: Block configs for the interpreter (CPU tensors): small, so tests cover several blocks and
#: ragged tails while staying cheap (the interpreter costs per program instance and per op).
INTERPRET_CONFIG = {
    "fwd": dict(BLOCK_M=8, BLOCK_N=8, num_warps=1, num_stages=1),
    "dkdv": dict(BLOCK_M=8, BLOCK_N=8, num_warps=1, num_stages=1),
    "dq": dict(BLOCK_M=8, BLOCK_N=8, num_warps=1, num_stages=1),
}


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


def rotate_block(d_p: int) -> int:
    """Rows per program of the backward's RoPE pre-pass on GPU (4 gathered [rows, D] tiles)."""
    return 64 if d_p <= 64 else 32


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)

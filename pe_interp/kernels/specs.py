"""Positional-encoding specs shared by the fused kernel and the plain-torch reference.

Nothing here imports Triton: this module (and ``pe_interp.kernels``) must import on a CPU-only
machine without touching a GPU driver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RopeSpec", "RelBiasSpec", "validate_attention_args"]

#: dtypes the fused kernel accepts (float32 accumulation in all cases).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: the reference additionally runs in float64 (used as ground truth by tests / benchmarks).
REFERENCE_DTYPES = (*KERNEL_DTYPES, torch.float64)
#: largest head dim the kernel supports (q/k and v head dims are padded to a power of two).
MAX_HEAD_DIM = 128


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding with *interleaved* (adjacent) pairs, applied inside the kernel.

    For pair ``i`` (dims ``start + 2i`` and ``start + 2i + 1``) at position ``p``, with
    ``c = cos[p, i]`` and ``s = sin[p, i]``::

        x'[2i]   = x[2i] * c - x[2i+1] * s
        x'[2i+1] = x[2i] * s + x[2i+1] * c

    Dims outside ``[start, start + dim)`` are left alone (partial RoPE by dims, or decoupled /
    MLA-style RoPE with ``start`` = content head dim). ``heads`` (Bool[H]) selects the rotated
    heads; ``None`` rotates all of them.
    """

    cos: Tensor  # [S_table >= S, dim // 2] float, angle table for positions 0..S_table-1
    sin: Tensor  # [S_table >= S, dim // 2]
    start: int
    dim: int
    heads: Tensor | None = None


@dataclass(frozen=True)
class RelBiasSpec:
    """Learned relative-position bias (T5-style table): ``bias[h, i, j] = table[h, buckets[i, j]]``."""

    table: Tensor  # [H, NB] float, may require grad
    buckets: Tensor  # Int64 [S_q, S_k] bucket index of pair (i, j), values in [0, NB)


def _err(msg: str) -> ValueError:
    return ValueError(f"attention: {msg}")


def validate_attention_args(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    key_valid: Tensor | None,
    rope: RopeSpec | None,
    alibi_slopes: Tensor | None,
    rel_bias: RelBiasSpec | None,
    dtypes: tuple[torch.dtype, ...] = REFERENCE_DTYPES,
    max_head_dim: int | None = None,
) -> None:
    """Check shapes, dtypes and devices; raise ``ValueError`` with a clear message otherwise."""
    B, H, S, Dqk = _check_qkv(q, k, v, dtypes, max_head_dim)
    if isinstance(scale, Tensor) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise _err(f"scale must be a finite Python float, got {scale!r}")
    if not isinstance(causal, bool):
        raise _err(f"causal must be a bool, got {causal!r}")
    dev = q.device
    if key_valid is not None:
        if not isinstance(key_valid, Tensor) or key_valid.dtype != torch.bool:
            raise _err("key_valid must be a bool tensor [B, S_k] (True = real token)")
        if tuple(key_valid.shape) != (B, S):
            raise _err(f"key_valid must be [B, S_k] = [{B}, {S}], got {tuple(key_valid.shape)}")
        _same_device("key_valid", key_valid, dev)
    if rope is not None:
        _check_rope(rope, H, S, Dqk, dev)
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor) or not alibi_slopes.is_floating_point():
            raise _err("alibi_slopes must be a float tensor [H]")
        if tuple(alibi_slopes.shape) != (H,):
            raise _err(f"alibi_slopes must be [H] = [{H}], got {tuple(alibi_slopes.shape)}")
        _same_device("alibi_slopes", alibi_slopes, dev)
    if rel_bias is not None:
        _check_rel_bias(rel_bias, H, S, dev)


def _check_qkv(
    q: Tensor, k: Tensor, v: Tensor, dtypes: tuple[torch.dtype, ...], max_head_dim: int | None
) -> tuple[int, int, int, int]:
    """q, k and v: 4-d tensors of one supported dtype on one device, k shaped like q, v with
    its own head dim; returns q's ``B, H, S, Dqk``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise _err(f"{name} must be [B, H, S, D], got shape {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise _err(f"{name} has dtype {t.dtype}; supported: {[str(d) for d in dtypes]}")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    dev = q.device
    if k.device != dev or v.device != dev:
        raise _err(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, S, Dqk = q.shape
    if tuple(k.shape) != (B, H, S, Dqk):
        raise _err(
            f"k must have the shape of q {tuple(q.shape)} (S_q == S_k is required), got {tuple(k.shape)}"
        )
    if tuple(v.shape[:3]) != (B, H, S):
        raise _err(f"v must be [B, H, S, Dv] = [{B}, {H}, {S}, Dv], got {tuple(v.shape)}")
    Dv = v.shape[-1]
    if min(B, H, S, Dqk, Dv) < 1:
        raise _err(f"empty input: q {tuple(q.shape)}, v {tuple(v.shape)}")
    if max_head_dim is not None and (Dqk > max_head_dim or Dv > max_head_dim):
        raise _err(f"head dims must be <= {max_head_dim}, got Dqk={Dqk}, Dv={Dv}")
    return B, H, S, Dqk


def _same_device(name: str, t: Tensor, dev: torch.device) -> None:
    if t.device != dev:
        raise _err(f"{name} is on {t.device} but q is on {dev}")


def _check_rope(rope: RopeSpec, H: int, S: int, Dqk: int, dev: torch.device) -> None:
    if not isinstance(rope, RopeSpec):
        raise _err(f"rope must be a RopeSpec, got {type(rope).__name__}")
    R, st = rope.dim, rope.start
    if not isinstance(R, int) or not isinstance(st, int):
        raise _err("rope.start and rope.dim must be ints")
    if R <= 0 or R % 2:
        raise _err(f"rope.dim must be a positive even number, got {R}")
    if st < 0 or st + R > Dqk:
        raise _err(f"rope dims [{st}, {st + R}) do not fit in the q/k head dim {Dqk}")
    for name in ("cos", "sin"):
        t = getattr(rope, name)
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise _err(f"rope.{name} must be a float tensor")
        if t.dim() != 2 or t.shape[1] != R // 2 or t.shape[0] < S:
            raise _err(
                f"rope.{name} must be [S_table >= {S}, dim // 2 = {R // 2}], got {tuple(t.shape)}"
            )
        _same_device(f"rope.{name}", t, dev)
    if rope.heads is not None:
        hd = rope.heads
        if not isinstance(hd, Tensor) or hd.dtype != torch.bool or tuple(hd.shape) != (H,):
            raise _err(f"rope.heads must be a bool tensor [H] = [{H}] or None")
        _same_device("rope.heads", hd, dev)


def _check_rel_bias(rel_bias: RelBiasSpec, H: int, S: int, dev: torch.device) -> None:
    if not isinstance(rel_bias, RelBiasSpec):
        raise _err(f"rel_bias must be a RelBiasSpec, got {type(rel_bias).__name__}")
    tab, bk = rel_bias.table, rel_bias.buckets
    if not isinstance(tab, Tensor) or not tab.is_floating_point() or tab.dim() != 2:
        raise _err("rel_bias.table must be a float tensor [H, NB]")
    if tab.shape[0] != H or tab.shape[1] < 1:
        raise _err(f"rel_bias.table must be [H = {H}, NB >= 1], got {tuple(tab.shape)}")
    if not isinstance(bk, Tensor) or bk.dtype not in (torch.int64, torch.int32):
        raise _err("rel_bias.buckets must be an int64 tensor [S_q, S_k]")
    if tuple(bk.shape) != (S, S):
        raise _err(f"rel_bias.buckets must be [S_q, S_k] = [{S}, {S}], got {tuple(bk.shape)}")
    _same_device("rel_bias.table", tab, dev)
    _same_device("rel_bias.buckets", bk, dev)
    # Range check only where it is free (host tensors); on GPU it would force a sync.
    if (
        bk.device.type == "cpu"
        and bk.numel()
        and (int(bk.min()) < 0 or int(bk.max()) >= tab.shape[1])
    ):
        raise _err(f"rel_bias.buckets values must lie in [0, NB = {tab.shape[1]})")

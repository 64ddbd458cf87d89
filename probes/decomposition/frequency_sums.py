"""The arithmetic of :func:`probes.decomposition.frequency.frequency_usage`, one batch of one
layer at a time: the rotated queries and keys read from the cache, which heads each rotated pair
turns, and the summed chunk norms and per-example pair-logit shares. The summed squares are a
quadratic form (``(q0 k0 + q1 k1)^2`` expanded), so no ``[pairs, q, k]`` tensor is built; all in
float64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["F64", "cached_rotation", "layer_sums", "rotated_heads"]

F64 = torch.float64


def cached_rotation(model: ProbeModel, cache, layer: int) -> tuple[Tensor, Tensor]:
    """Layer ``layer``'s rotated queries ``[b, pos, n_heads, d]`` and keys ``[b, pos, n_kv_heads,
    d]`` (grouped key heads not repeated): ``hook_rot_q/k`` where the model caches them (ours, a
    Llama bridge), else ``hook_q/k`` rotated by the encoding as the model rotates them."""
    pre = f"blocks.{layer}.attn."
    if pre + "hook_rot_q" in cache.cache_dict:
        return cache[pre + "hook_rot_q"], cache[pre + "hook_rot_k"]
    return model.encoding.rotate(cache[pre + "hook_q"], cache[pre + "hook_k"], layer)


def rotated_heads(spans, n_heads: int) -> Tensor:
    """Bool ``[n_heads, pairs]``: whether each span's pairs rotate each head."""
    cols = []
    for sp in spans:
        on = torch.ones(n_heads, dtype=torch.bool) if sp.heads is None else sp.heads.cpu().bool()
        cols.append(on[:, None].expand(-1, sp.dim // 2))
    return torch.cat(cols, 1) if cols else torch.zeros(n_heads, 0, dtype=torch.bool)


def layer_sums(
    q: Tensor, k: Tensor, ok: Tensor, real: Tensor, spans, kv: Tensor
) -> tuple[Tensor, Tensor]:
    """One batch of one layer: ``[4, n_heads, pairs]`` (the summed chunk norms of the queries and
    of each query head's key/value head over real tokens; the summed per-example logit shares,
    raw and row-centred) and ``[2, n_heads]`` (the examples whose shares were counted).

    ``q [b, n, H, d]``, ``k [b, n, G, d]`` rotated; ``ok [b, H, n, n]`` the entries counted;
    ``real [b, n]``; ``kv [H]`` each query head's key/value head."""
    realf, okf = real.to(F64), ok.to(F64)
    if k.shape[2] == q.shape[2]:
        kv = torch.arange(q.shape[2], device=q.device)
    rotated = rotated_heads(spans, q.shape[2]).to(q.device)
    qn, kn, sq, cq = [], [], [], []
    per_row = okf.sum(-1).permute(0, 2, 1)[..., None]  # [b, m, H, 1]: keys each query sees
    for sp in spans:
        q0, q1 = sp.pairs(q.to(F64))  # [b, n, H, p]
        k0, k1 = (x[:, :, kv] for x in sp.pairs(k.to(F64)))  # per query head
        qn.append(torch.einsum("bn,bnhp->hp", realf, torch.hypot(q0, q1)))
        kn.append(torch.einsum("bn,bnhp->hp", realf, torch.hypot(k0, k1)))
        # sum_{m,n} ok (q0_m k0_n + q1_m k1_n)^2 as a quadratic form in (q0^2, 2 q0 q1, q1^2)
        qf = torch.stack((q0 * q0, 2 * q0 * q1, q1 * q1), -1)  # [b, n, H, p, 3]
        kf = torch.stack((k0 * k0, k0 * k1, k1 * k1), -1)
        t = torch.einsum("bhmn,bnhpc->bmhpc", okf, kf)
        full = torch.einsum("bmhpc,bmhpc->bhp", qf, t)
        sq.append(full)
        # centred along each row: minus (sum_n ok a_p[m, n])^2 / (keys of row m), summed over m
        r = torch.einsum("bhmn,bnhpc->bmhpc", okf, torch.stack((k0, k1), -1))
        rows = q0 * r[..., 0] + q1 * r[..., 1]  # [b, m, H, p]
        mean_sq = torch.where(per_row > 0, rows**2 / per_row.clamp(min=1), torch.zeros_like(rows))
        cq.append((full - mean_sq.sum(1)).clamp(min=0))
    shares, valid = [], []
    for parts in (sq, cq):
        ss = torch.cat(parts, -1) * rotated[None]  # [b, H, pairs]
        total = ss.sum(-1, keepdim=True)
        ok_b = total[..., 0] > 0
        shares.append(torch.where(ok_b[..., None], ss / total.clamp(min=1e-300), 0 * ss).sum(0))
        valid.append(ok_b.to(F64).sum(0))
    sums = torch.stack((torch.cat(qn, -1), torch.cat(kn, -1), *shares))
    return sums, torch.stack(valid)

"""ALiBi read from a bridge's own forward (:func:`alibi_slopes`), not from its model type: BLOOM,
MPT and Falcon (``alibi=True``) each add ``slope_h * j`` (or ``-slope_h * (i - j)``, the same up to
a constant per query row, which the softmax ignores) to their attention scores, in their own
code, with their own slopes and scales.

One forward of a few tokens caches every layer's ``hook_q``, ``hook_k`` and ``hook_attn_scores``.
Within the causal mask, each head's scores are fitted, per layer, as

    scores[i, j] = c_h * q_i . k_j + slope_h * j + r_i

(``r_i`` a constant per query row, removed by centring each row; ``c_h`` the head's scale, which
is the model's own: ``1/sqrt(d_head)``, or, in Falcon, the same factor applied to the bias too). A
bridge has ALiBi where the fit is exact in every layer (to float32 rounding of the scores, and to
bfloat16 rounding of the bias, which Falcon builds in bfloat16), some slope is not zero, and every layer
has the same slopes; they are returned in the scores' units. A rotary model whose ``hook_q``/
``hook_k`` hold q/k before the rotation does not fit (the rotation is not a bias), and one that
hooks them after it fits with every slope zero: neither has ALiBi.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from pe_interp.bridge_forward import cached

__all__ = ["alibi_slopes", "read_alibi_slopes"]

FIT_TOLERANCE = 1e-4  # of the scores' scale: float32 rounding of the same sums stays far below
BIAS_ROUNDING = 2.0**-7  # of the largest bias: twice bfloat16's rounding of the bias itself

_READ: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> slopes or None


def alibi_slopes(bridge: Any, n_tokens: int = 7) -> Tensor | None:
    """:func:`read_alibi_slopes`, once per bridge."""
    if bridge not in _READ:
        _READ[bridge] = read_alibi_slopes(bridge, n_tokens)
    return _READ[bridge]


def read_alibi_slopes(bridge: Any, n_tokens: int = 7) -> Tensor | None:
    """Each query head's ALiBi slope ``[n_heads]`` (float32, in the units of the attention scores),
    read from one forward of ``n_tokens`` random tokens (module docstring); None where the bridge
    adds no such bias, or does not hook q, k and the scores in every layer."""
    n_layers = len(bridge.blocks)
    d_vocab = int(bridge.cfg.d_vocab)
    names = [
        f"blocks.{i}.attn.hook_{t}" for i in range(n_layers) for t in ("q", "k", "attn_scores")
    ]
    g = torch.Generator().manual_seed(0)
    device = next(bridge.parameters()).device
    tokens = torch.randint(0, d_vocab, (1, max(3, n_tokens)), generator=g).to(device)
    got, missing = cached(bridge, tokens, names)
    if missing is not None:
        return None
    found = None
    for i in range(n_layers):
        pre = f"blocks.{i}.attn.hook_"
        slopes = _fit(got[pre + "q"], got[pre + "k"], got[pre + "attn_scores"])
        if slopes is None:
            return None
        if found is None:
            found = slopes
        elif not torch.allclose(slopes, found, rtol=1e-3, atol=1e-6):
            return None  # ALiBi's slopes are the model's, the same in every layer
    return found.float() if found is not None and bool((found != 0).any()) else None


def _fit(q: Tensor, k: Tensor, scores: Tensor) -> Tensor | None:
    """The slopes of one layer, where ``scores`` is ``c_h q.k + slope_h j + r_i`` exactly under the
    causal mask (None where it is not, or the hooks have other shapes). ``q [b, pos, H, d]``,
    ``k [b, pos, H_kv, d]`` (grouped heads repeated as Hugging Face repeats them), ``scores
    [b, H, pos, pos]``."""
    if q.dim() != 4 or k.dim() != 4 or scores.dim() != 4:
        return None
    b, p, n_heads, _ = q.shape
    if k.shape[2] < 1 or n_heads % k.shape[2] or scores.shape != (b, n_heads, p, p):
        return None
    k = k.repeat_interleave(n_heads // k.shape[2], dim=2)
    raw = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double())[0]  # [H, q, k]
    s = scores.double()[0]
    allowed = torch.ones(p, p, dtype=torch.bool, device=s.device).tril()
    if not bool(torch.isfinite(s[:, allowed]).all()):
        return None
    rows = allowed.double()
    count = rows.sum(1, keepdim=True)
    j = torch.arange(p, dtype=torch.float64, device=s.device)[None].expand(p, -1)

    def centred(x: Tensor) -> Tensor:  # [..., q, k]: each row minus its mean over allowed keys
        x = x * rows
        return (x - x.sum(-1, keepdim=True) / count) * rows

    y, x1, x2 = centred(s), centred(raw), centred(j)[None].expand_as(raw)
    design = torch.stack([x1.flatten(1), x2.flatten(1)], dim=-1)  # [H, entries, 2]
    coef = torch.linalg.lstsq(design, y.flatten(1)[..., None]).solution[..., 0]  # [H, 2]
    fitted = (design @ coef[..., None])[..., 0]
    slopes = coef[:, 1]
    tol = FIT_TOLERANCE * max(1.0, float(s[:, allowed].abs().max()))
    # Falcon builds its bias in bfloat16 (slope times position, rounded): exact to 2^-8 of itself
    rounding = BIAS_ROUNDING * float(slopes.abs().max()) * (p - 1)
    if float((fitted - y.flatten(1)).abs().max()) > tol + rounding:
        return None
    return torch.where(slopes.abs() * (p - 1) > tol, slopes, torch.zeros_like(slopes))

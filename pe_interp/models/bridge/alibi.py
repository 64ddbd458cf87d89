"""ALiBi read from a bridge's own forward (:func:`alibi_slopes`), not from its model type: BLOOM,
MPT and Falcon (``alibi=True``) each add ``slope_h * j`` (or ``-slope_h * (i - j)``, the same up to
a constant per query row, which the softmax ignores) to their attention scores, in their own
code, with their own slopes and scales.

One forward of a few tokens caches every layer's ``hook_q``, ``hook_k`` and ``hook_attn_scores``.
Within the causal mask, each head's scores are fitted, per layer, as

    scores[i, j] = c_h * q_i . k_j + slope_h * j + r_i

(``r_i`` a constant per query row, removed by centring each row; ``c_h`` the head's scale, which
is the model's own: ``1/sqrt(d_head)``, or, in Falcon, the same factor applied to the bias too). A
bridge has ALiBi where the fit is exact in every layer (to float32 rounding of the scores, a few
units in the last place of half-precision ones, and bfloat16 rounding of the bias, which Falcon
builds in bfloat16; masked entries, -inf in TransformerLens' compatibility mode, are left out),
some slope is larger than that rounding allows, and every layer has the same slopes; they are
returned in the scores' units. A rotary model whose ``hook_q``/
``hook_k`` hold q/k before the rotation does not fit (the rotation is not a bias), and one that
hooks them after it fits with every slope zero: neither has ALiBi.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from pe_interp.models.bridge.forward import cached

__all__ = ["alibi_slopes", "read_alibi_slopes"]

FIT_TOLERANCE = 1e-4  # of the scores' scale: float32 rounding of the same sums stays far below
BIAS_ROUNDING = 2.0**-7  # of the largest bias: twice bfloat16's rounding of the bias itself
HALF = (torch.float16, torch.bfloat16)

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
        fit = _fit(got[pre + "q"], got[pre + "k"], got[pre + "attn_scores"])
        if fit is None:
            return None
        slopes, resolution = fit
        if found is None:
            found = slopes
        elif not torch.allclose(slopes, found, rtol=1e-3, atol=2 * resolution):
            return None  # ALiBi's slopes are the model's, the same in every layer
    return found.float() if found is not None and bool((found != 0).any()) else None


def _fit(q: Tensor, k: Tensor, scores: Tensor) -> tuple[Tensor, float] | None:
    """The slopes of one layer and how finely they are resolved, where ``scores`` is
    ``c_h q.k + slope_h j + r_i`` under the causal mask to the scores' own rounding (None where it
    is not, or the hooks have other shapes; every slope 0 where none is resolved). ``q [b, pos, H, d]``,
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
    count = allowed.sum(1, keepdim=True).double()
    j = torch.arange(p, dtype=torch.float64, device=s.device)[None].expand(p, -1)

    def centred(x: Tensor) -> Tensor:  # [..., q, k]: each row minus its mean over allowed keys
        x = torch.where(allowed, x, 0.0)  # masked entries may be -inf: never multiplied
        return torch.where(allowed, x - x.sum(-1, keepdim=True) / count, 0.0)

    y, x1, x2 = centred(s), centred(raw), centred(j)[None].expand_as(raw)
    design = torch.stack([x1.flatten(1), x2.flatten(1)], dim=-1)  # [H, entries, 2]
    coef = torch.linalg.lstsq(design.cpu(), y.flatten(1)[..., None].cpu()).solution[..., 0]
    fitted = (design.cpu() @ coef[..., None])[..., 0]
    slopes = coef[:, 1]  # [H]
    # the scores' own rounding: float32's well below FIT_TOLERANCE, half precision's a few ulps
    ulps = 4 * torch.finfo(scores.dtype).eps if scores.dtype in HALF else 0.0
    tol = max(FIT_TOLERANCE, ulps) * max(1.0, float(s[:, allowed].abs().max()))
    # Falcon builds its bias in bfloat16 (slope times position, rounded): exact to 2^-8 of itself
    rounding = BIAS_ROUNDING * float(slopes.abs().max()) * (p - 1)
    err = float((fitted - y.flatten(1).cpu()).abs().max())
    if not err <= tol + rounding:  # NaN included
        return None
    # a bias is there where some head's moves a score by more than the rounding over the prompt;
    # then every head keeps its fitted slope (ALiBi gives every head one), else none has a bias
    resolution = tol / (p - 1)
    if not float(slopes.abs().max()) > resolution:
        return torch.zeros_like(slopes).to(q.device), resolution
    return slopes.to(q.device), resolution

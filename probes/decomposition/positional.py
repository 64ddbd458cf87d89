"""Positional scores of every head: how much of its logits is a function of positions alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pe_interp.encodings import rotary_spans_for
from pe_interp.util.io import (
    load_result,
    nan_array,
    register_result,
    write_result,
)
from pe_interp.util.modes import eval_mode
from probes.common.inputs import check_count, check_examples, check_finite_model, takes_probe_model
from probes.decomposition.reads import allowed, attention_scale, qk_hooks, rotated_qk, unrotated_qk
from probes.decomposition.toeplitz import toeplitz_score

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["PositionalScores", "positional_scores"]

DEFINITION = "split-half R^2 of a position-only (query, key) template; toeplitz = mean per-example Toeplitz R^2"


RESULT_KIND = register_result(
    "positional scores", "PositionalScores.load", ("scores", "toeplitz", "n_examples")
)


@dataclass(frozen=True, eq=False)
class PositionalScores:
    """Position-only structure of every head's pre-softmax logits, ``[n_layers, n_heads]``.

    - ``scores`` (primary) = ``template``: the share of a head's logit variance (over examples
      and allowed (query, key) entries) explained by a **position-only template** ``T[i, j]``, the
      mean logit at (i, j) over examples. Whatever depends only on positions, absolute or relative
      (a Toeplitz RoPE/ALiBi/T5 pattern, "attend to position 0", ``p_i^T W p_j``) is common to all
      examples and lands in the template; what depends on the tokens varies between examples and
      does not. The template is estimated on one half of the examples and scored on the other
      (split-half R^2, both ways, averaged), so noise does not inflate the score (fitting the
      template in-sample would give about ``1/n_examples`` even to a pure-content head); clipped
      at 0. A head whose logits are exactly position-only scores 1.
    - ``toeplitz``: the mean over examples of :func:`toeplitz_score` of the head's logits on each
      example (the part that is a function of ``j - i`` alone within one example); high for
      relative-position heads even when content modulates them per example.
    - ``direct``: the variance of the encoding's own term in the head's logits (the rotated
      logit minus the same logit un-rotated, plus any positional bias) over the variance of the
      logits: where position *enters*. A head that only reads position written by an earlier
      head has position-only structure in its template but a direct term of exactly 0; so does
      every head of a model whose encoding only adds to the residual stream (absolute encodings).

    Both are defined for every head of any model and need no knowledge of the encoding; NaN
    only where a head's logits are constant.
    """

    scores: Tensor
    toeplitz: Tensor
    n_examples: int
    direct: Tensor | None = None  # None in files written before it was measured

    @property
    def template(self) -> Tensor:
        return self.scores

    def argmax(self, layer: int | None = None) -> tuple[int, int]:
        """(layer, head) with the highest score (within ``layer`` if given)."""
        s = torch.nan_to_num(self.scores, nan=-math.inf)
        if layer is not None:
            return layer, int(s[layer].argmax())
        i = int(s.flatten().argmax())
        return divmod(i, s.shape[1])

    def entry(self) -> tuple[int, int] | None:
        """(layer, head) with the largest direct term: where position enters (None when unmeasured
        or when no head has one, as with an absolute encoding)."""
        if self.direct is None:
            return None
        d = torch.nan_to_num(self.direct, nan=-math.inf)
        if not bool((d > 0).any()):
            return None
        return divmod(int(d.flatten().argmax()), d.shape[1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "scores": self.scores.tolist(),
            "toeplitz": self.toeplitz.tolist(),
            "direct": None if self.direct is None else self.direct.tolist(),
            "n_examples": self.n_examples,
            "definition": DEFINITION,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PositionalScores:
        return cls(
            scores=torch.from_numpy(nan_array(d["scores"])).float(),
            toeplitz=torch.from_numpy(nan_array(d["toeplitz"])).float(),
            n_examples=int(d["n_examples"]),
            direct=None
            if d.get("direct") is None
            else torch.from_numpy(nan_array(d["direct"])).float(),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> PositionalScores:
        return load_result(path, RESULT_KIND, cls.from_dict)


@takes_probe_model
def positional_scores(
    model: ProbeModel, tokens: Tensor, *, pad_mask: Tensor | None = None, batch_size: int = 8
) -> PositionalScores:
    """:class:`PositionalScores` of every head on ``tokens [n, pos]`` (n >= 2)."""
    check_finite_model(model, "positional_scores")
    check_count(batch_size, "batch_size", 1, "positional_scores")
    tokens, _, checked_pm = check_examples(model, tokens, None, pad_mask, who="positional_scores")
    pad_mask = None if pad_mask is None else checked_pm
    n, n_pos = tokens.shape
    if n < 2:
        raise ValueError("positional_scores: need at least 2 examples (the template is split-half)")
    L = model.cfg.n_layers
    enc = model.encoding
    # the encoding's own term needs its terms (not over a bridge's ALiBi: NaN there, the rest is measured)
    reads_direct = enc.decomposes
    d_sums, halves, toep_sum, toep_n = _sums(model, tokens, pad_mask, batch_size, reads_direct)
    template = _split_half(*halves)
    toeplitz = torch.where(
        toep_n > 0, toep_sum / toep_n.clamp(min=1), torch.full_like(toep_sum, math.nan)
    )
    m = d_sums[4].clamp(min=1)
    var_d = d_sums[1] / m - (d_sums[0] / m) ** 2
    var_s = d_sums[3] / m - (d_sums[2] / m) ** 2
    direct = torch.where(
        var_s > 0, var_d.clamp(min=0) / var_s.clamp(min=1e-300), torch.full_like(var_s, math.nan)
    )
    if not reads_direct or (
        enc.rotates and any(rotary_spans_for(enc, layer, n_pos) is None for layer in range(L))
    ):
        direct = torch.full_like(
            direct, math.nan
        )  # it rotates without saying how (or biases unseen): not measurable
    return PositionalScores(
        scores=template.float().cpu(),
        toeplitz=toeplitz.float().cpu(),
        n_examples=n,
        direct=direct.float().cpu(),
    )


def _sums(model: ProbeModel, tokens: Tensor, pad_mask, batch_size: int, reads_direct: bool):
    """One forward per batch: the sums of the encoding's own term and of the logits
    (``[5, L, H]``: d, d^2, s, s^2, count over valid entries), each half's sums, sums of squares
    and counts per (layer, head, i, j), and the summed per-example Toeplitz R^2 and its count."""
    cfg, device, f64 = model.cfg, model.W_E.device, torch.float64
    n, n_pos = tokens.shape
    L, H = cfg.n_layers, cfg.n_heads
    d_sums = torch.zeros(5, L, H, dtype=f64, device=device)
    # per half: each head's own mask (a sliding-window layer allows fewer entries than a global one)
    s1 = torch.zeros(2, L, H, n_pos, n_pos, dtype=f64, device=device)
    s2 = torch.zeros_like(s1)
    cnt = torch.zeros_like(s1)
    toep_sum = torch.zeros(L, H, dtype=f64, device=device)
    toep_n = torch.zeros(L, H, dtype=f64, device=device)
    half_of = torch.arange(n) % 2
    with eval_mode(model), torch.no_grad():
        for start in range(0, n, batch_size):
            rows = slice(start, min(n, start + batch_size))
            toks = tokens[rows].to(device)
            pm = None if pad_mask is None else pad_mask[rows].to(device)
            scores, finite, direct = _batch(model, toks, pm, reads_direct)
            d_sums += torch.stack(
                [
                    (direct * finite).sum((0, 3, 4)),
                    (direct**2 * finite).sum((0, 3, 4)),
                    scores.sum((0, 3, 4)),
                    (scores**2).sum((0, 3, 4)),
                    finite.to(f64).sum((0, 3, 4)),
                ]
            )
            t = toeplitz_score(scores, finite)
            ok = torch.isfinite(t)
            toep_sum += torch.where(ok, t, torch.zeros_like(t)).sum(0)
            toep_n += ok.sum(0)
            for hf in (0, 1):
                sel = (half_of[rows] == hf).to(device)
                if not bool(sel.any()):
                    continue
                s1[hf] += scores[sel].sum(0)
                s2[hf] += (scores[sel] ** 2).sum(0)
                cnt[hf] += finite[sel].to(f64).sum(0)
    return d_sums, (s1, s2, cnt), toep_sum, toep_n


def _batch(model: ProbeModel, toks: Tensor, pm, reads_direct: bool):
    """One batch's logits ``[b, L, H, q, k]`` in float64 (0 where not allowed), the allowed
    entries, and the encoding's own term in them."""
    cfg, device, f64 = model.cfg, model.W_E.device, torch.float64
    L, n_pos = cfg.n_layers, toks.shape[1]
    names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in range(L)]
    direct_names = [
        n for layer in range(L) for n in qk_hooks(layer) + [f"blocks.{layer}.attn.hook_pos_bias"]
    ]
    _, cache = model.run_with_cache(toks, pm, names_filter=names + direct_names)
    raw = torch.stack([cache[nm] for nm in names], 1)  # [b, L, H, q, k]
    finite = allowed(raw)  # in the dtype the model masked in
    scores = raw.to(f64)
    if cfg.mask_padding:
        qv = (toks != cfg.pad_id) if pm is None else pm
        finite = finite & qv[:, None, None, :, None]
    scores = torch.where(finite, scores, torch.zeros((), dtype=f64, device=device))
    direct = torch.stack(
        [_direct(model, cache, layer, n_pos, reads_direct) for layer in range(L)], 1
    )
    return scores, finite, direct


def _split_half(s1: Tensor, s2: Tensor, cnt: Tensor) -> Tensor:
    """The template's R^2: fitted on one half, scored on the other, both ways, averaged;
    clipped to [0, 1] (NaN where the scored half's logits do not vary)."""
    f64 = torch.float64
    r2 = []
    for a, b in ((0, 1), (1, 0)):
        both = (cnt[a] > 0) & (cnt[b] > 0)
        t_a = s1[a] / cnt[a].clamp(min=1)
        w = both.to(f64)
        n_b = (cnt[b] * w).sum((-2, -1))
        sum_b = (s1[b] * w).sum((-2, -1))
        sq_b = (s2[b] * w).sum((-2, -1))
        ss_tot = sq_b - sum_b**2 / n_b.clamp(min=1)
        ss_res = (w * (s2[b] - 2 * t_a * s1[b] + cnt[b] * t_a**2)).sum((-2, -1))
        deg = ss_tot <= 1e-20 * sq_b.clamp(min=1e-300)
        r2.append(
            torch.where(
                deg, torch.full_like(ss_tot, math.nan), 1 - ss_res / ss_tot.clamp(min=1e-300)
            )
        )
    return ((r2[0] + r2[1]) / 2).clamp(min=0.0, max=1.0)


def _direct(model: ProbeModel, cache, layer: int, n_pos: int, reads: bool = True) -> Tensor:
    """The encoding's own term in layer ``layer``'s logits ``[b, H, q, k]``: rotated minus un-rotated
    q.k (scaled), plus the positional bias (0 where the encoding does neither, or ``reads`` is False)."""
    pre = f"blocks.{layer}.attn."
    like = cache[pre + "hook_attn_scores"]
    out = None
    if reads and model.encoding.rotates:
        q, k = (t.double() for t in rotated_qk(model, cache, layer))
        plain = unrotated_qk(model, cache, layer)
        if plain is None:  # undo the rotation with the encoding's own tables
            qu, ku = q.clone(), k.clone()
            for span in rotary_spans_for(model.encoding, layer, n_pos) or ():
                cos = span.cos[:n_pos, None, :].double().to(q.device)  # [pos, 1, half]
                sin = span.sin[:n_pos, None, :].double().to(q.device)
                rotated = (
                    torch.ones(q.shape[2], dtype=torch.bool, device=q.device)
                    if span.heads is None
                    else span.heads.to(q.device)
                )
                part = slice(span.start, span.start + span.dim)
                for t in (qu, ku):
                    t[..., part] = torch.where(
                        rotated[:, None], span.turn(t, cos, -sin), t[..., part]
                    )
        else:
            qu, ku = (t.double() for t in plain)
        scale = attention_scale(model, layer)
        out = (
            torch.einsum("bqhd,bkhd->bhqk", q, k) - torch.einsum("bqhd,bkhd->bhqk", qu, ku)
        ) * scale
    if pre + "hook_pos_bias" in cache.cache_dict:
        bias = cache[pre + "hook_pos_bias"].double()
        out = bias.expand(like.shape[0], -1, -1, -1) if out is None else out + bias
    return torch.zeros(like.shape, dtype=torch.float64, device=like.device) if out is None else out

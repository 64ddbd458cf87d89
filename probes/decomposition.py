"""Decomposition of a head's pre-softmax attention logits into content and position terms.

Paper digest §2. For head h of layer l, with ``s = 1/sqrt(d_qk)``, the logit the model computes is

    L[i, j] = s * rot(q_i) . rot(k_j) + B[i, j]          (then + mask, then softmax)

where ``rot`` is the encoding's rotation (RoPE; identity otherwise) and ``B`` its relative bias
(T5, ALiBi; zero otherwise). See :mod:`pe_interp.attention`.

**Layer 0, any encoding** (:func:`logit_terms`). The layer's input is ``x = c + p``: token embedding
``c`` (``hook_embed``) plus the absolute positional vector ``p`` (``hook_pos_embed``; absent for
relative and rotary encodings). LayerNorm is made linear by freezing its scale at the value the
model actually used (``ln1.hook_scale``, as TransformerLens does when it folds LayerNorm), so

    LN(x_i) = (x_i - mean(x_i)) / scale_i * w + b
            = [centre(c_i)/scale_i * w] + [centre(p_i)/scale_i * w] + b
            =        content_i          +        position_i         + offset

The **offset** component collects everything that is the same at every position and for every
token: LayerNorm's bias ``b``; the projections' biases ``b_Q``/``b_K`` are added to it too (so
``q^offset = b W_Q + b_Q``). Keeping it separate (rather than folding it into content) keeps the
content terms purely token-driven. Each component goes through the (linear) projection, extension
(decoupled RoPE) and rotation separately, which gives 3 x 3 Gram terms ``"{query}-{key}"``, e.g.
``"content-position"`` = ``s * rot(q^content_i) . rot(k^position_j)``, plus ``"relative_bias"``.
Terms whose component does not exist (``position`` without an absolute encoding,
``relative_bias`` without a bias encoding) are left out. With ``kv_source="embed"`` the keys read
the raw, un-normalised input, so the key side has no LayerNorm and an offset of ``b_K`` alone.
The terms sum to the model's logits (tested to 1e-4 for every encoding).

Note: a term that depends only on the query (e.g. ``"content-offset"``: ``q^content_i . k^offset``)
shifts a whole row and so cannot change the attention pattern.

**Layers > 0**: the residual stream has no clean content/position split; the terms are ``"qk"``
(``s * rot(q) . rot(k)``) and ``"relative_bias"``.

**Rotary encodings, any layer** (:class:`RopeTerms`): writing each rotated pair k of the
(un-rotated) head vectors as a complex number, ``q_m^(k)``, ``k_n^(k)``,

    s * rot(q_m) . rot(k_n) = s * Re sum_k  q_m^(k) conj(k_n^(k)) e^{i (m - n) theta_k}  + unrotated
                            = s * Re sum_k  (G^(k) o E^(k))[m, n]                     + unrotated

with the complex content Gram matrix ``G^(k)_{mn} = q_m^(k) conj(k_n^(k))`` and the Toeplitz,
rank-one, unit-diagonal relative-position kernel ``E^(k)_{mn} = e^{i (m-n) theta_k}`` (the paper's
Hadamard form). ``unrotated`` holds dimensions the encoding does not rotate (partial RoPE, the
content path of decoupled RoPE). Pairs are RoPE's **adjacent (interleaved)** pairs
``(2k, 2k+1)`` of each rotated span.

:func:`toeplitz_score` measures how much of a ``[q, k]`` matrix is a function of ``j - i`` alone,
and :func:`positional_scores` scores every head of a model for position-only structure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# Toeplitz structure
# ---------------------------------------------------------------------------------------------


def diagonal_means(matrix: Tensor, valid: Tensor | None = None) -> Tensor:
    """Replace every entry of ``[..., q, k]`` by the mean of its diagonal (``j - i`` constant),
    averaging only over ``valid`` entries (a diagonal with no valid entry gives 0)."""
    *lead, n_q, n_k = matrix.shape
    if valid is None:
        valid = torch.ones(n_q, n_k, dtype=torch.bool, device=matrix.device)
    valid = valid.expand(matrix.shape)
    diag = (torch.arange(n_k, device=matrix.device)[None, :] - torch.arange(n_q, device=matrix.device)[:, None]) + (n_q - 1)
    index = diag.reshape(-1).expand(*lead, n_q * n_k)
    w = valid.to(matrix.dtype).reshape(*lead, n_q * n_k)
    x = torch.where(valid, matrix, torch.zeros((), dtype=matrix.dtype, device=matrix.device)).reshape(*lead, n_q * n_k)
    sums = torch.zeros(*lead, n_q + n_k - 1, dtype=matrix.dtype, device=matrix.device).scatter_add_(-1, index, x)
    counts = torch.zeros_like(sums).scatter_add_(-1, index, w)
    means = sums / counts.clamp(min=1)
    return means.gather(-1, index).reshape(matrix.shape)


def toeplitz_score(matrix: Tensor, valid: Tensor | None = None) -> Tensor:
    """Fraction of the variance of ``matrix [..., q, k]`` over the ``valid`` entries explained by
    its diagonal means: ``1 - SS_res / SS_tot``, where ``SS_res`` sums the squared deviations from
    each entry's diagonal mean and ``SS_tot`` those from the overall mean (both over ``valid``).

    The diagonal means are the least-squares Toeplitz fit, so the score is the R^2 of "this
    matrix is a function of the relative position ``j - i``": 1 for a Toeplitz matrix (ALiBi, T5,
    any RoPE kernel), near ``(n_q + n_k - 1) / n_valid`` for noise. ``valid`` (broadcastable bool,
    e.g. the causal lower triangle or the non-pad square) defaults to every entry. Returns NaN
    where the matrix is constant over ``valid`` (0 / 0). Leading dims are batched.
    """
    matrix = matrix.double() if matrix.dtype in (torch.float16, torch.bfloat16, torch.float32) else matrix
    if valid is None:
        valid = torch.ones(matrix.shape[-2:], dtype=torch.bool, device=matrix.device)
    valid = valid.to(matrix.device).expand(matrix.shape)
    zero = torch.zeros((), dtype=matrix.dtype, device=matrix.device)
    n = valid.sum((-2, -1)).to(matrix.dtype)
    x = torch.where(valid, matrix, zero)
    mean = x.sum((-2, -1)) / n.clamp(min=1)
    ss_tot = torch.where(valid, (matrix - mean[..., None, None]) ** 2, zero).sum((-2, -1))
    ss_res = torch.where(valid, (matrix - diagonal_means(matrix, valid)) ** 2, zero).sum((-2, -1))
    scale = torch.where(valid, matrix**2, zero).sum((-2, -1))
    degenerate = ss_tot <= 1e-20 * scale.clamp(min=1e-300)
    return torch.where(degenerate, torch.full_like(ss_tot, math.nan), 1 - ss_res / ss_tot.clamp(min=1e-300))


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeSpan:
    """One rotated span of a head vector: dims ``[start, start + dim)``, frequencies ``theta``."""

    start: int
    dim: int
    theta: Tensor  # [dim // 2] rad/token
    cos: Tensor  # [n_ctx, dim // 2], the tables the model uses
    sin: Tensor


def rope_spans(encoding, layer: int, head: int) -> list[RopeSpan]:
    """The rotated spans of ``head``'s q/k vectors under ``encoding`` (empty if none)."""
    from pe_interp.encodings import Composite, DecoupledRoPE, RoPE

    parts = list(encoding.parts) if isinstance(encoding, Composite) else [encoding]
    spans: list[RopeSpan] = []
    for enc in parts:
        if isinstance(enc, RoPE):
            if enc.head_mask is not None and not bool(enc.head_mask[head]):
                continue
            start, dim = 0, enc.rotary_dim
        elif isinstance(enc, DecoupledRoPE):
            start, dim = enc.d_head, enc.d_rope
        else:
            if enc.rotates:
                raise ValueError(f"rope_spans: cannot decompose the rotation of encoding {type(enc).__name__}")
            continue
        theta = float(enc.base) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        spans.append(RopeSpan(start, dim, theta, enc.cos, enc.sin))
    for a in spans:
        for b in spans:
            if a is not b and a.start < b.start + b.dim and b.start < a.start + a.dim:
                raise ValueError("rope_spans: overlapping rotations (two rotary encodings on the same dims)")
    return spans


@dataclass(frozen=True, eq=False)
class RopeTerms:
    """Per-frequency decomposition of one head's ``s * rot(q) . rot(k)`` (see the module doc).

    - ``theta [n_pairs]``: each pair's frequency (rad/token), spans in order;
    - ``pair_logits [n_pairs, q, k]``: each pair's exact contribution ``s * (rq_2k rk_2k +
      rq_2k+1 rk_2k+1)``;
    - ``gram [n_pairs, q, k]`` (complex): ``G^(k)_{mn} = q_m^(k) conj(k_n^(k))`` of the
      un-rotated vectors;
    - ``kernel [n_pairs, q, k]`` (complex): ``E^(k)_{mn} = exp(i (m - n) theta_k)``;
    - ``unrotated [q, k]``: ``s`` times the dot product over dims that are not rotated.
    """

    theta: Tensor
    pair_logits: Tensor
    gram: Tensor
    kernel: Tensor
    unrotated: Tensor
    scale: float

    @property
    def n_pairs(self) -> int:
        return int(self.theta.shape[0])

    def hadamard(self) -> Tensor:
        """``s * Re(G^(k) o E^(k))`` per pair ``[n_pairs, q, k]`` (equals ``pair_logits``)."""
        return self.scale * (self.gram * self.kernel).real

    @property
    def total(self) -> Tensor:
        """``s * rot(q) . rot(k)`` rebuilt from the Hadamard form."""
        return self.hadamard().sum(0).to(self.unrotated.dtype) + self.unrotated

    def check(self, qk: Tensor) -> float:
        """Max error of both identities against the actual ``s * rot(q) . rot(k)``."""
        a = (self.pair_logits.sum(0) + self.unrotated - qk).abs().max()
        b = (self.total - qk).abs().max()
        return float(torch.maximum(a, b))

    def frequency_share(self) -> Tensor:
        """Each pair's share of the summed squared pair contributions ``[n_pairs]``."""
        ss = self.pair_logits.double().pow(2).sum((-2, -1))
        return ss / ss.sum().clamp(min=1e-300)


def rope_terms(rot_q: Tensor, rot_k: Tensor, spans: list[RopeSpan], scale: float) -> RopeTerms:
    """:class:`RopeTerms` of one head from its rotated ``rot_q [q, d]``, ``rot_k [k, d]``."""
    n_q, d = rot_q.shape
    n_k = rot_k.shape[0]
    rotated = torch.zeros(d, dtype=torch.bool)
    thetas, pairs, grams, kernels = [], [], [], []
    pos_q = torch.arange(n_q, dtype=torch.float64, device=rot_q.device)
    pos_k = torch.arange(n_k, dtype=torch.float64, device=rot_q.device)
    for sp in spans:
        rotated[sp.start : sp.start + sp.dim] = True
        rq = rot_q[:, sp.start : sp.start + sp.dim].double()
        rk = rot_k[:, sp.start : sp.start + sp.dim].double()
        # exact per-pair contributions of the rotated vectors
        pair = torch.einsum("qpt,kpt->pqk", rq.view(n_q, -1, 2), rk.view(n_k, -1, 2)) * scale
        # un-rotate with the model's own tables (exact inverse up to rounding)
        cq, sq = sp.cos[:n_q].double().to(rq.device), sp.sin[:n_q].double().to(rq.device)
        ck, sk = sp.cos[:n_k].double().to(rq.device), sp.sin[:n_k].double().to(rq.device)
        zq = torch.complex(rq[:, 0::2], rq[:, 1::2]) * torch.complex(cq, -sq)  # [q, pairs]
        zk = torch.complex(rk[:, 0::2], rk[:, 1::2]) * torch.complex(ck, -sk)
        gram = torch.einsum("qp,kp->pqk", zq, zk.conj())
        theta = sp.theta.to(rq.device)
        rel = pos_q[:, None] - pos_k[None, :]
        kernel = torch.polar(torch.ones_like(rel)[None].expand(theta.shape[0], -1, -1), rel[None] * theta[:, None, None])
        thetas.append(theta)
        pairs.append(pair)
        grams.append(gram)
        kernels.append(kernel)
    keep = ~rotated.to(rot_q.device)
    unrot = (rot_q[:, keep] @ rot_k[:, keep].T) * scale
    return RopeTerms(
        theta=torch.cat(thetas),
        pair_logits=torch.cat(pairs).to(rot_q.dtype),
        gram=torch.cat(grams),
        kernel=torch.cat(kernels),
        unrotated=unrot,
        scale=scale,
    )


# ---------------------------------------------------------------------------------------------
# logit terms of one head
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LogitTerms:
    """The terms of one head's pre-softmax logits on one example (see the module docstring).

    - ``terms``: name -> ``[q_pos, k_pos]``; they sum to ``total``.
    - ``actual``: the model's pre-softmax scores: ``hook_attn_scores`` where the mask allows the
      entry, and elsewhere (masked by padding or causality, where the hook holds -inf) the same
      scores without the mask, ``s * rot_q . rot_k + bias`` from the model's cached q/k.
    - ``valid``: where the mask allows attention (key real, and causal if the model is).
    - ``rope``: per-frequency / Hadamard decomposition when the encoding rotates this head.
    """

    layer: int
    head: int
    example: int
    terms: dict[str, Tensor]
    actual: Tensor
    valid: Tensor
    query_valid: Tensor
    rope: RopeTerms | None
    components: tuple[str, ...]
    encoding: str
    scale: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> Tensor:
        out = torch.zeros_like(self.actual)
        for t in self.terms.values():
            out = out + t
        return out

    @property
    def qk(self) -> Tensor:
        """``s * rot(q) . rot(k)``: everything but the relative bias."""
        return sum((t for k, t in self.terms.items() if k != "relative_bias"), torch.zeros_like(self.actual))

    def check(self) -> float:
        """Max |sum of terms - actual| over every entry (and the RoPE identities, if any)."""
        err = float((self.total - self.actual).abs().max())
        if self.rope is not None:
            err = max(err, self.rope.check(self.qk))
        return err

    def grouped(self) -> dict[str, Tensor]:
        """The paper's grouping: the four content/position Gram terms, all offset (bias)
        cross terms summed into ``"offset"``, and ``"relative_bias"``."""
        out: dict[str, Tensor] = {}
        for name, t in self.terms.items():
            key = "offset" if "offset" in name.split("-") else name
            out[key] = out[key] + t if key in out else t
        return out

    @property
    def region(self) -> Tensor:
        """Entries that matter: allowed by the mask at a real query."""
        return self.valid & self.query_valid[:, None]

    def variance_shares(self) -> dict[str, float]:
        """Each term's variance over :attr:`region` as a share of the total's variance
        (shares of correlated terms need not sum to 1)."""
        region = self.region
        tot = self.total[region].double().var(unbiased=False)
        return {k: float(t[region].double().var(unbiased=False) / tot) if tot > 0 else math.nan for k, t in self.terms.items()}

    def toeplitz_scores(self) -> dict[str, float]:
        """:func:`toeplitz_score` of every term and of the total, over :attr:`region`."""
        out = {k: float(toeplitz_score(t, self.region)) for k, t in self.terms.items()}
        out["total"] = float(toeplitz_score(self.total, self.region))
        return out

    def to_dict(self, matrices: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "layer": self.layer,
            "head": self.head,
            "example": self.example,
            "encoding": self.encoding,
            "components": list(self.components),
            "terms": list(self.terms),
            "scale": self.scale,
            "max_error": self.check(),
            "variance_shares": self.variance_shares(),
            "toeplitz": self.toeplitz_scores(),
            "n_valid": int(self.region.sum()),
        }
        if self.rope is not None:
            d["rope"] = {
                "theta": self.rope.theta.tolist(),
                "frequency_share": self.rope.frequency_share().tolist(),
            }
        if matrices:
            d["matrices"] = {k: v.detach().cpu().double().tolist() for k, v in self.terms.items()}
            d["matrices"]["actual"] = self.actual.detach().cpu().double().tolist()
        return d


def _project(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
    """``x [b, p, m] -> [b, p, h, d]`` like :meth:`Attention._project`."""
    out = torch.einsum("bpm,hmd->bphd", x, W)
    return out if b is None else out + b


def _linear_norm(norm: Any, x: Tensor, scale: Tensor | None, with_offset: bool) -> Tensor:
    """``norm`` with its scale frozen: linear in ``x``; the bias only ``with_offset``."""
    from pe_interp.model import Norm

    if not isinstance(norm, Norm):  # nn.Identity
        return x
    if norm.center:
        x = x - x.mean(-1, keepdim=True)
    x = x / scale * norm.w
    if with_offset and norm.b is not None:
        x = x + norm.b
    return x


def logit_terms(
    model,
    tokens: Tensor,
    layer: int,
    head: int,
    *,
    pad_mask: Tensor | None = None,
    example: int = 0,
) -> LogitTerms:
    """Decompose head ``head`` of ``layer``'s pre-softmax logits on row ``example`` of ``tokens``.

    Layer 0 gives the content / position / offset Gram terms (plus ``relative_bias``); any
    layer gives ``"qk"`` and ``"relative_bias"``; rotary heads also get :class:`RopeTerms`.
    """
    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"logit_terms: layer must be in 0..{cfg.n_layers - 1}, got {layer}")
    if not 0 <= head < cfg.n_heads:
        raise ValueError(f"logit_terms: head must be in 0..{cfg.n_heads - 1}, got {head}")
    if tokens.ndim == 1:
        tokens = tokens[None]
        pad_mask = None if pad_mask is None else pad_mask.reshape(1, -1)
    if not 0 <= example < tokens.shape[0]:
        raise ValueError(f"logit_terms: example must be in 0..{tokens.shape[0] - 1}, got {example}")
    device = model.W_E.device
    toks = tokens[example : example + 1].to(device)
    pm = None if pad_mask is None else pad_mask[example : example + 1].to(device)
    enc = model.encoding
    attn = model.blocks[layer].attn
    pre = f"blocks.{layer}"
    names = [
        f"{pre}.attn.hook_attn_scores",
        f"{pre}.attn.hook_q",
        f"{pre}.attn.hook_k",
        f"{pre}.attn.hook_rot_q",
        f"{pre}.attn.hook_rot_k",
        f"{pre}.attn.hook_pos_bias",
        f"{pre}.ln1.hook_scale",
        f"{pre}.hook_resid_pre",
        "hook_embed",
        "hook_pos_embed",
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(toks, pm, names_filter=names)
            cache = {k: cache[k] for k in names if k in cache}
            result = _logit_terms(model, toks, pm, layer, head, cache, enc, attn)
    finally:
        model.train(was_training)
    return LogitTerms(example=example, **result)


def _logit_terms(model, toks, pm, layer, head, cache, enc, attn) -> dict[str, Any]:
    cfg = model.cfg
    pre = f"blocks.{layer}"
    n_pos = toks.shape[1]
    scale = float(attn.scale)
    bias_all = cache.get(f"{pre}.attn.hook_pos_bias")
    bias = None if bias_all is None else bias_all[head]
    if enc.rotates:
        rot_q, rot_k = cache[f"{pre}.attn.hook_rot_q"], cache[f"{pre}.attn.hook_rot_k"]
    else:
        rot_q, rot_k = cache[f"{pre}.attn.hook_q"], cache[f"{pre}.attn.hook_k"]
    qk_actual = torch.einsum("qd,kd->qk", rot_q[0, :, head], rot_k[0, :, head]) * scale
    unmasked = qk_actual if bias is None else qk_actual + bias
    scores = cache[f"{pre}.attn.hook_attn_scores"][0, head]
    valid = torch.isfinite(scores)
    actual = torch.where(valid, scores, unmasked)
    if cfg.mask_padding:
        query_valid = (toks[0] != cfg.pad_id) if pm is None else pm[0]
    else:
        query_valid = torch.ones(n_pos, dtype=torch.bool, device=toks.device)

    terms: dict[str, Tensor] = {}
    components: tuple[str, ...] = ()
    if layer == 0:
        c = cache["hook_embed"]
        p = cache.get("hook_pos_embed")
        comps = {"content": c, "position": p, "offset": None}
        if p is None:
            del comps["position"]
        components = tuple(comps)
        ln = model.blocks[0].ln1
        ln_scale = cache.get(f"{pre}.ln1.hook_scale")
        embed_kv = cfg.kv_source == "embed"
        zeros = torch.zeros_like(c)
        qs, ks = {}, {}
        for name, x in comps.items():
            off = name == "offset"
            xq = _linear_norm(ln, zeros if off else x, ln_scale, off)
            xkv = (zeros if off else x) if embed_kv else xq
            q = _project(xq, attn.W_Q, attn.b_Q if off else None)
            k = _project(xkv, attn.W_K, attn.b_K if off else None)
            q, k = enc.extend(xq, xkv, q, k, layer)
            if enc.rotates:
                q, k = enc.rotate(q, k, layer)
            qs[name], ks[name] = q[0, :, head], k[0, :, head]
        for a in comps:
            for b in comps:
                terms[f"{a}-{b}"] = (qs[a] @ ks[b].T) * scale
    else:
        terms["qk"] = qk_actual
    if bias is not None:
        terms["relative_bias"] = bias.to(actual.dtype)

    rope = None
    spans = rope_spans(enc, layer, head) if enc.rotates else []
    if spans:
        rope = rope_terms(rot_q[0, :, head], rot_k[0, :, head], spans, scale)
    return {
        "layer": layer,
        "head": head,
        "terms": terms,
        "actual": actual,
        "valid": valid,
        "query_valid": query_valid,
        "rope": rope,
        "components": components,
        "encoding": str(getattr(cfg, "encoding_name", cfg.encoding)),
        "scale": scale,
    }


# ---------------------------------------------------------------------------------------------
# positional scores of every head
# ---------------------------------------------------------------------------------------------
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

    Both are defined for every head of any model and need no knowledge of the encoding; NaN
    only where a head's logits are constant.
    """

    scores: Tensor
    toeplitz: Tensor
    n_examples: int

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "scores": self.scores.tolist(),
            "toeplitz": self.toeplitz.tolist(),
            "n_examples": self.n_examples,
            "definition": "split-half R^2 of a position-only (query, key) template; toeplitz = mean per-example Toeplitz R^2",
        }


def positional_scores(
    model, tokens: Tensor, *, pad_mask: Tensor | None = None, batch_size: int = 8
) -> PositionalScores:
    """:class:`PositionalScores` of every head on ``tokens [n, pos]`` (n >= 2)."""
    cfg = model.cfg
    n, n_pos = tokens.shape
    if n < 2:
        raise ValueError("positional_scores: need at least 2 examples (the template is split-half)")
    device = model.W_E.device
    L, H = cfg.n_layers, cfg.n_heads
    names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in range(L)]
    f64 = torch.float64
    # per half: sums and sums of squares per (layer, head, i, j), counts per (i, j)
    s1 = torch.zeros(2, L, H, n_pos, n_pos, dtype=f64, device=device)
    s2 = torch.zeros_like(s1)
    cnt = torch.zeros(2, n_pos, n_pos, dtype=f64, device=device)
    toep_sum = torch.zeros(L, H, dtype=f64, device=device)
    toep_n = torch.zeros(L, H, dtype=f64, device=device)
    half_of = torch.arange(n) % 2
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                rows = slice(start, min(n, start + batch_size))
                toks = tokens[rows].to(device)
                pm = None if pad_mask is None else pad_mask[rows].to(device)
                _, cache = model.run_with_cache(toks, pm, names_filter=names)
                scores = torch.stack([cache[nm] for nm in names], 1).to(f64)  # [b, L, H, q, k]
                finite = torch.isfinite(scores)
                if cfg.mask_padding:
                    qv = (toks != cfg.pad_id) if pm is None else pm
                    finite = finite & qv[:, None, None, :, None]
                scores = torch.where(finite, scores, torch.zeros((), dtype=f64, device=device))
                valid = finite[:, 0, 0]  # [b, q, k]: the same for every head
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
                    cnt[hf] += valid[sel].to(f64).sum(0)
    finally:
        model.train(was_training)

    r2 = []
    for a, b in ((0, 1), (1, 0)):
        both = (cnt[a] > 0) & (cnt[b] > 0)
        t_a = s1[a] / cnt[a].clamp(min=1)
        w = both.to(f64)
        n_b = (cnt[b] * w).sum()
        sum_b = (s1[b] * w).sum((-2, -1))
        sq_b = (s2[b] * w).sum((-2, -1))
        ss_tot = sq_b - sum_b**2 / n_b.clamp(min=1)
        ss_res = (w * (s2[b] - 2 * t_a * s1[b] + cnt[b] * t_a**2)).sum((-2, -1))
        deg = ss_tot <= 1e-20 * sq_b.clamp(min=1e-300)
        r2.append(torch.where(deg, torch.full_like(ss_tot, math.nan), 1 - ss_res / ss_tot.clamp(min=1e-300)))
    template = ((r2[0] + r2[1]) / 2).clamp(min=0.0, max=1.0)
    toeplitz = torch.where(toep_n > 0, toep_sum / toep_n.clamp(min=1), torch.full_like(toep_sum, math.nan))
    return PositionalScores(scores=template.float().cpu(), toeplitz=toeplitz.float().cpu(), n_examples=n)


__all__ = [
    "LogitTerms",
    "PositionalScores",
    "RopeSpan",
    "RopeTerms",
    "diagonal_means",
    "logit_terms",
    "positional_scores",
    "rope_spans",
    "rope_terms",
    "toeplitz_score",
]

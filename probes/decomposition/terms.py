"""The terms of one head's pre-softmax attention logits on one example (see
:mod:`probes.decomposition`): content / position / offset Gram terms at layer 0, ``qk`` deeper,
the relative bias, and the per-frequency RoPE terms of rotary heads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    check_decomposable,
    check_example,
    check_examples,
    check_finite_model,
    check_head,
    check_layer,
    takes_probe_model,
)
from probes.decomposition.reads import (
    FROZEN_SCALES,
    allowed,
    attention_scale,
    layer0_qk,
    rotated_qk,
)
from probes.decomposition.rope import RopeTerms, rope_spans, rope_terms
from probes.decomposition.toeplitz import toeplitz_score

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["LogitTerms", "logit_terms"]


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
        return sum(
            (t for k, t in self.terms.items() if k != "relative_bias"),
            torch.zeros_like(self.actual),
        )

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
        return {
            k: float(t[region].double().var(unbiased=False) / tot) if tot > 0 else math.nan
            for k, t in self.terms.items()
        }

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


@takes_probe_model
def logit_terms(
    model: ProbeModel,
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
    who = "logit_terms"
    layer, head = check_layer(model, layer, who), check_head(model, head, who)
    check_finite_model(model, who)
    check_decomposable(model, who)
    if isinstance(tokens, Tensor) and tokens.ndim == 1:
        tokens = tokens[None]
        pad_mask = pad_mask.reshape(1, -1) if isinstance(pad_mask, Tensor) else pad_mask
    tokens, _, full_pm = check_examples(model, tokens, None, pad_mask, who=who)
    example = check_example(example, tokens.shape[0], who)
    toks = tokens[example : example + 1]
    pm = None if pad_mask is None else full_pm[example : example + 1]
    pre = f"blocks.{layer}"
    names = [
        f"{pre}.attn.hook_attn_scores",
        f"{pre}.attn.hook_q",
        f"{pre}.attn.hook_k",
        f"{pre}.attn.hook_rot_q",
        f"{pre}.attn.hook_rot_k",
        f"{pre}.attn.hook_pos_bias",
        f"{pre}.ln1.hook_scale",
        *(FROZEN_SCALES if layer == 0 else ()),
        f"{pre}.hook_resid_pre",
        "hook_embed",
        "hook_pos_embed",
    ]
    with eval_mode(model), torch.no_grad():
        _, cache = model.run_with_cache(toks, pm, names_filter=names)
        cache = {k: cache[k] for k in names if k in cache}
        result = _logit_terms(model, toks, pm, layer, head, cache)
    return LogitTerms(example=example, **result)


def _component_qk(
    model: ProbeModel, toks, pm, head: int, cache: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Layer 0's rotated q and k of ``head`` ``[pos, d_qk]`` for each component of its input
    (``content``, ``position`` when the encoding has one, ``offset``), by the model's own code.

    With ``ln1``'s scale frozen at the value of the real forward, the path from the layer's input
    ``x`` to rotated q (and k) is affine, ``Q(x) = A x + Q(0)``; ``Q(0)`` (LayerNorm's bias through
    the projection, plus ``b_Q``, extended and rotated) is the offset, and ``Q(c) - Q(0)``,
    ``Q(p) - Q(0)`` are the content and position parts (:func:`~probes.decomposition.reads.layer0_qk`).
    """
    ln_scale = cache.get("blocks.0.ln1.hook_scale")  # absent when the model has no norm
    frozen = {n: cache[n] for n in FROZEN_SCALES if n in cache}  # a QK-norm's too
    unfrozen = model.encoding.unfrozen_norms(0)
    if unfrozen:
        raise ValueError(
            f"logit_terms: {model.cfg.encoding_name}: a norm in layer 0 whose scale cannot be "
            f"frozen ({'; '.join(unfrozen)}), so layer 0's content and offset parts cannot be "
            "split linearly; deeper layers' terms can"
        )
    c, p = cache["hook_embed"], cache.get("hook_pos_embed")
    _check_layer0_input(model, cache, c, p)
    q0, k0 = layer0_qk(model, toks, pm, torch.zeros_like(c), ln_scale, head, frozen)
    qs, ks = {}, {}
    for name, x in (("content", c), ("position", p)):
        if x is not None:
            q, k = layer0_qk(model, toks, pm, x, ln_scale, head, frozen)
            qs[name], ks[name] = q - q0, k - k0
    qs["offset"], ks["offset"] = q0, k0
    return qs, ks


def _check_layer0_input(
    model: ProbeModel, cache: dict[str, Tensor], c: Tensor, p: Tensor | None
) -> None:
    """A one-line ValueError where layer 0's input is not ``hook_embed`` (plus ``hook_pos_embed``)
    as cached: something between them (an embedding scale or norm applied after the hook) would
    leave the content and position parts short of the input the model's layer 0 reads."""
    real = cache.get("blocks.0.hook_resid_pre")
    if real is None:  # (ours adds the two hooks' outputs, so it passes by construction)
        return
    parts = c if p is None else c + p
    gap = float((parts.double() - real.double()).abs().max()) if parts.shape == real.shape else 1.0
    if gap > 1e-4 * (1.0 + float(real.detach().abs().max())):
        raise ValueError(
            f"logit_terms: {model.cfg.encoding_name}: layer 0's input is not hook_embed"
            + ("" if p is None else " + hook_pos_embed")
            + f" (max gap {gap:.2g}: the embedding is scaled or normed after its hook), so the "
            "content and position terms of layer 0 cannot be split; deeper layers' terms can"
        )


def _logit_terms(model: ProbeModel, toks, pm, layer, head, cache) -> dict[str, Any]:
    cfg, enc = model.cfg, model.encoding
    pre = f"blocks.{layer}"
    n_pos = toks.shape[1]
    scale = attention_scale(model, layer)
    bias_all = cache.get(f"{pre}.attn.hook_pos_bias")
    bias = None if bias_all is None else bias_all[head]
    rot_q, rot_k = rotated_qk(model, cache, layer)
    qk_actual = torch.einsum("qd,kd->qk", rot_q[0, :, head], rot_k[0, :, head]) * scale
    unmasked = qk_actual if bias is None else qk_actual + bias
    scores = cache[f"{pre}.attn.hook_attn_scores"][0, head]
    valid = allowed(scores)
    actual = torch.where(valid, scores, unmasked)
    if cfg.mask_padding:
        query_valid = (toks[0] != cfg.pad_id) if pm is None else pm[0]
    else:
        query_valid = torch.ones(n_pos, dtype=torch.bool, device=toks.device)

    terms: dict[str, Tensor] = {}
    components: tuple[str, ...] = ()
    if layer == 0:
        qs, ks = _component_qk(model, toks, pm, head, cache)
        components = tuple(qs)
        for a in components:
            for b in components:
                terms[f"{a}-{b}"] = (qs[a] @ ks[b].T) * scale
    else:
        terms["qk"] = qk_actual
    if bias is not None:
        terms["relative_bias"] = bias.to(actual.dtype)

    rope = None
    spans = rope_spans(enc, layer, head, n_pos)
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
        "encoding": cfg.encoding_name,
        "scale": scale,
    }

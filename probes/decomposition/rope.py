"""Per-frequency terms of a rotary head's logit: the paper's Hadamard form.

Writing each rotated pair k of the (un-rotated) head vectors as a complex number, ``q_m^(k)``,
``k_n^(k)``::

    s * rot(q_m) . rot(k_n) = s * Re sum_k  q_m^(k) conj(k_n^(k)) e^{i (m - n) theta_k}  + unrotated
                            = s * Re sum_k  (G^(k) o E^(k))[m, n]                     + unrotated

with the complex content Gram matrix ``G^(k)_{mn} = q_m^(k) conj(k_n^(k))`` and the Toeplitz,
rank-one, unit-diagonal relative-position kernel ``E^(k)_{mn} = e^{i (m-n) theta_k}``. A pair is
two adjacent dims, or dims ``i`` and ``i + dim/2`` of a span (``RotarySpan.halves``: Hugging
Face's ``rotate_half``, as a bridge over Llama or GPT-NeoX rotates). The spans,
their frequencies and the cos/sin tables come from the encoding
(:meth:`pe_interp.encodings.Encoding.rotary_spans`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pe_interp.encodings import RotarySpan, rotary_spans_for

__all__ = ["RopeSpan", "RopeTerms", "rope_spans", "rope_terms"]


# One rotated span of a head vector, as the encoding describes it (kept under its old name).
RopeSpan = RotarySpan


def rope_spans(encoding, layer: int, head: int, n_pos: int | None = None) -> list[RopeSpan] | None:
    """The rotated spans of ``head``'s q/k vectors in ``layer``, as ``encoding`` describes them
    (:meth:`~pe_interp.encodings.Encoding.rotary_spans`): empty if the head is not rotated, None
    if the encoding rotates without describing how. ``n_pos``: the positions the tables must
    cover (:func:`~pe_interp.encodings.rotary_spans_for`; None: the model's context)."""
    described = (
        encoding.rotary_spans(layer) if n_pos is None else rotary_spans_for(encoding, layer, n_pos)
    )
    if described is None:
        return None
    spans = [s for s in described if s.rotates_head(head)]
    for a in spans:
        for b in spans:
            if a is not b and a.start < b.start + b.dim and b.start < a.start + a.dim:
                raise ValueError(
                    "rope_spans: overlapping rotations (two rotary encodings on the same dims)"
                )
    return spans


@dataclass(frozen=True, eq=False)
class RopeTerms:
    """Per-frequency decomposition of one head's ``s * rot(q) . rot(k)`` (see the module doc).

    - ``theta [n_pairs]``: each pair's frequency (rad/token), spans in order;
    - ``pair_logits [n_pairs, q, k]``: each pair's exact contribution ``s * (rq_2k rk_2k +
      rq_2k+1 rk_2k+1)`` (dims ``k`` and ``k + dim/2`` for a ``halves`` span);
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
        q0, q1 = sp.pairs(rot_q.double())  # [q, pairs] each
        k0, k1 = sp.pairs(rot_k.double())
        # exact per-pair contributions of the rotated vectors
        pair = (torch.einsum("qp,kp->pqk", q0, k0) + torch.einsum("qp,kp->pqk", q1, k1)) * scale
        # un-rotate with the model's own tables (exact inverse up to rounding)
        cq, sq = sp.cos[:n_q].double().to(q0.device), sp.sin[:n_q].double().to(q0.device)
        ck, sk = sp.cos[:n_k].double().to(q0.device), sp.sin[:n_k].double().to(q0.device)
        zq = torch.complex(q0, q1) * torch.complex(cq, -sq)  # [q, pairs]
        zk = torch.complex(k0, k1) * torch.complex(ck, -sk)
        gram = torch.einsum("qp,kp->pqk", zq, zk.conj())
        theta = sp.theta.to(q0.device)
        rel = pos_q[:, None] - pos_k[None, :]
        kernel = torch.polar(
            torch.ones_like(rel)[None].expand(theta.shape[0], -1, -1),
            rel[None] * theta[:, None, None],
        )
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

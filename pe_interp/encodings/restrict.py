"""Position where you choose: a per-head encoding restricted to some heads and layers.

``rope(heads=(3,), layers=(1,))``, ``alibi(heads=(2,))`` or ``t5(layers=(0,))``: the encoding acts
on the named heads of the named layers and leaves every other head exactly as NoPE would
(un-rotated queries and keys, no logit bias). This is how the planted models of the ground-truth
families put position into the model at known places (``heads``/``layers`` default to all).

The restriction is a spec-level parameter of every encoding that acts per head (it rotates q/k or
adds a logit bias); :func:`pe_interp.encodings.spec.build_encoding` wraps the encoding in
:class:`Restricted` unless its own constructor takes the parameter (RoPE keeps its own
``heads``). An absolute encoding enters the residual stream once, before any head, so a
restriction of it is refused (one line, from :func:`~pe_interp.encodings.spec.make_spec`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import Encoding, FusedPE, HeadAxes, ModelShape, RotarySpan

RESTRICTIONS = ("heads", "layers")


def check_indices(enc: str, name: str, value: Any, count: int) -> tuple[int, ...] | None:
    """A restriction's value: None (all), or a non-empty tuple of distinct indices < ``count``."""
    if value is None:
        return None
    what = "head" if name == "heads" else "layer"
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, tuple | list) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in value
    ):
        raise ValueError(
            f"{enc}: {name} must be a list of {what} indices (e.g. {name}=(0,)), got {value!r}"
        )
    if not value or any(not 0 <= v < count for v in value) or len(set(value)) != len(value):
        raise ValueError(
            f"{enc}: {name} must be distinct {what} indices in 0..{count - 1}, got {tuple(value)}"
        )
    return tuple(sorted(value))


class Restricted(Encoding):
    """``inner`` acting on ``heads`` of ``layers`` only (None: all of them)."""

    def __init__(
        self,
        cfg: ModelShape,
        inner: Encoding,
        heads: tuple[int, ...] | None = None,
        layers: tuple[int, ...] | None = None,
    ):
        super().__init__(cfg)
        name = inner.registry_name or type(inner).__name__
        self.inner = inner
        self.heads = check_indices(name, "heads", heads, cfg.n_heads)
        self.layers = check_indices(name, "layers", layers, cfg.n_layers)
        mask = torch.ones(cfg.n_heads, dtype=torch.bool)
        if self.heads is not None:
            mask = torch.zeros(cfg.n_heads, dtype=torch.bool)
            mask[list(self.heads)] = True
        self.register_buffer("head_mask", mask, persistent=False)

    @property
    def kind(self):  # type: ignore[override]
        return self.inner.kind

    @property
    def rotates(self) -> bool:
        return self.inner.rotates

    @property
    def has_bias(self) -> bool:
        return self.inner.has_bias

    def acts_in(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def extra_qk_dims(self) -> int:
        return self.inner.extra_qk_dims()

    def residual(self, n_pos: int):
        return self.inner.residual(n_pos)

    def extend(self, x_q, x_kv, q, k, layer):
        # the extra sub-space exists in every layer (its projections are parameters); only its
        # rotation, the positional part, is restricted
        return self.inner.extend(x_q, x_kv, q, k, layer)

    def rotate(self, q: Tensor, k: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        if not self.acts_in(layer):
            return q, k
        rq, rk = self.inner.rotate(q, k, layer)
        if self.heads is None:
            return rq, rk
        keep = self.head_mask[:, None]  # [head, 1] against [..., head, d]
        return torch.where(keep, rq, q.to(rq.dtype)), torch.where(keep, rk, k.to(rk.dtype))

    def bias(self, n_q: int, n_k: int, layer: int):
        if not self.acts_in(layer):
            return None
        b = self.inner.bias(n_q, n_k, layer)
        if b is None or self.heads is None:
            return b
        return torch.where(
            self.head_mask[:, None, None], b, torch.zeros((), dtype=b.dtype, device=b.device)
        )

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...] | None:
        spans = self.inner.rotary_spans(layer)
        if spans is None or not self.acts_in(layer):
            return spans if spans is None else ()
        out = []
        for s in spans:
            heads = self.head_mask if s.heads is None else (s.heads & self.head_mask)
            out.append(RotarySpan(s.start, s.dim, s.theta, s.cos, s.sin, heads, s.halves))
        return tuple(out)

    def head_parameters(self) -> dict[str, HeadAxes]:
        return {f"inner.{name}": axes for name, axes in self.inner.head_parameters().items()}

    def fused(self, layer: int, n_pos: int) -> FusedPE | None:
        # the kernel takes a head mask for RoPE only; the auto backend uses SDPA for the rest
        if not self.acts_in(layer):
            return FusedPE()
        view = self.inner.fused(layer, n_pos)
        if view is None or self.heads is None:
            return view
        if view.alibi_slopes is not None or view.rel_bias is not None or view.rope is None:
            return None
        rope = view.rope
        mask = self.head_mask if rope.heads is None else rope.heads & self.head_mask
        return FusedPE(rope=type(rope)(rope.cos, rope.sin, rope.start, rope.dim, mask))

    def init_parameters(self, generator: torch.Generator, std: float) -> None:
        self.inner.init_parameters(generator, std)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, heads={self.heads}, layers={self.layers}"

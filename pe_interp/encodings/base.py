"""The positional-encoding plug-in interface, the registry, and composition.

An encoding can touch the model in up to three places, and nowhere else:

1. ``residual(n_pos)``: a vector per position, added to the token embeddings (absolute PEs);
2. ``rotate(q, k, layer)``: a per-position transform of queries and keys (RoPE);
3. ``bias(n_q, n_k, layer)``: a ``[head, q_pos, k_pos]`` term added to the attention logits
   (T5, ALiBi).

A fourth, rarer hook, ``extend(x_q, x_kv, q, k, layer)``, appends extra query/key dimensions
before rotation (MLA-style decoupled RoPE). ``pe_interp/models/hooked/attention.py`` is the one file where all
of these enter the logit.

What a probe or the kernel needs to know about an encoding, the encoding says here, so that a
registered encoding works with every probe: :meth:`Encoding.fused` (the kernel's view),
:meth:`Encoding.rotary_spans` (the rotated dimensions and their frequencies, for the
per-frequency logit terms) and :meth:`Encoding.head_parameters` (the parameters that hold one
slice per attention head, for per-head gradients). No probe looks at an encoding's class.

Each encoding declares its ``kind`` (``none``, ``additive``, ``multiplicative`` or ``hybrid``),
which is how reports group results, following the paper.

An encoding is an ``nn.Module`` built once per model from the model config; per-layer parameters
are stacked along a leading ``layer`` axis. Its hyper-parameters are keyword arguments of its
constructor, described by an :class:`EncodingSpec` so a config can name them and round-trip through
JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch
from jaxtyping import Float
from torch import Tensor, nn

Kind = Literal["none", "additive", "multiplicative", "hybrid"]
KINDS: tuple[str, ...] = ("none", "additive", "multiplicative", "hybrid")


class ModelShape(Protocol):
    """What an encoding reads of the model config (:class:`pe_interp.ModelConfig` has all of it)."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    n_ctx: int
    init_mode: str
    encoding: Any  # the parsed specs, a tuple of EncodingSpec


@dataclass(frozen=True)
class RotarySpan:
    """One rotated span of the q/k head vectors (see :meth:`Encoding.rotary_spans`).

    Dims ``[start, start + dim)`` in **adjacent pairs** ``(start + 2i, start + 2i + 1)``; pair
    ``i`` at position ``p`` is rotated by the angle ``p * theta[i]``, whose cosine and sine are
    ``cos[p, i]`` and ``sin[p, i]`` (the tables the model itself uses). ``heads`` (bool
    ``[n_heads]``) marks the heads that are rotated; None: all of them. ``halves``: the pairs are
    ``(start + i, start + dim/2 + i)`` instead (Hugging Face's ``rotate_half``, read through a
    bridge: :class:`pe_interp.models.bridge.model.BridgeEncoding`).
    """

    start: int
    dim: int
    theta: Tensor  # [dim // 2], float64, rad/token
    cos: Tensor  # [n, dim // 2]: n_ctx rows, or at least the positions asked (rotary_spans_for)
    sin: Tensor
    heads: Tensor | None = None
    halves: bool = False

    def rotates_head(self, head: int) -> bool:
        return self.heads is None or bool(self.heads[head])

    def pairs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The two coordinates of every pair of this span in ``x [..., d]``: ``[..., dim // 2]`` each."""
        seg, half = x[..., self.start : self.start + self.dim], self.dim // 2
        return (
            (seg[..., :half], seg[..., half:]) if self.halves else (seg[..., 0::2], seg[..., 1::2])
        )

    def turn(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """This span of ``x [..., d]`` with every pair rotated by the angle whose cosine and sine
        are ``cos``, ``sin`` (broadcast against ``[..., dim // 2]``): ``[..., dim]``."""
        y0, y1 = self.pairs(x)
        a, b = y0 * cos - y1 * sin, y0 * sin + y1 * cos
        return torch.cat((a, b), dim=-1) if self.halves else torch.stack((a, b), dim=-1).flatten(-2)


@dataclass(frozen=True)
class HeadAxes:
    """Where a per-head parameter keeps its heads: ``head`` is the head axis, ``layer`` the
    layer axis of a table stacked over layers (None: the parameter belongs to no one layer)."""

    head: int
    layer: int | None = None


@dataclass(frozen=True)
class FusedPE:
    """What a fused attention kernel needs to know about an encoding in one layer.

    ``None`` in a field means that part is absent. An encoding whose ``fused`` returns ``None``
    cannot run inside the kernel, and the ``auto`` backend uses SDPA for it instead.
    """

    rope: Any = None  # pe_interp.kernels.RopeSpec
    alibi_slopes: Tensor | None = None  # [head]
    rel_bias: Any = None  # pe_interp.kernels.RelBiasSpec


class Encoding(nn.Module):
    """Base class: an encoding that does nothing (NoPE). Override what your encoding changes."""

    registry_name: ClassVar[str] = ""
    kind: ClassVar[Kind] = "none"

    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.d_head = cfg.d_head
        self.d_model = cfg.d_model
        self.n_layers = cfg.n_layers
        self.n_ctx = cfg.n_ctx
        self.init_mode = cfg.init_mode

    # ---- the four hooks into the model -------------------------------------------------------
    def residual(self, n_pos: int) -> Float[Tensor, "pos d_model"] | None:
        """Vector added to the token embedding at each position, or None."""
        return None

    def extend(
        self,
        x_q: Float[Tensor, "batch pos d_model"],
        x_kv: Float[Tensor, "batch pos d_model"],
        q: Float[Tensor, "batch pos head d_qk"],
        k: Float[Tensor, "batch pos head d_qk"],
        layer: int,
    ) -> tuple[Tensor, Tensor]:
        """Append extra (still un-rotated) q/k dimensions. Identity by default."""
        return q, k

    def rotate(
        self,
        q: Float[Tensor, "batch pos head d_qk"],
        k: Float[Tensor, "batch pos head d_qk"],
        layer: int,
    ) -> tuple[Tensor, Tensor]:
        """Transform queries and keys by position. Identity by default."""
        return q, k

    def bias(self, n_q: int, n_k: int, layer: int) -> Float[Tensor, "head q_pos k_pos"] | None:
        """Additive logit term, or None."""
        return None

    # ---- metadata ----------------------------------------------------------------------------
    @property
    def rotates(self) -> bool:
        """True when ``rotate`` or ``extend`` changes q/k (so ``hook_rot_q/k`` fire)."""
        return type(self).rotate is not Encoding.rotate or type(self).extend is not Encoding.extend

    @property
    def has_bias(self) -> bool:
        return type(self).bias is not Encoding.bias

    def extra_qk_dims(self) -> int:
        """How many dimensions ``extend`` appends to each q/k head vector."""
        return 0

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...] | None:
        """The spans that ``rotate`` rotates in ``layer``, with their frequencies.

        ``()`` for an encoding that does not rotate. An encoding that rotates but does not say
        how returns None (the default): probes then leave out what needs the frequencies (the
        per-frequency RoPE terms of :func:`probes.logit_terms`) and still do everything else.
        """
        return () if not self.rotates else None

    def head_parameters(self) -> dict[str, HeadAxes]:
        """This encoding's parameters that hold one slice per attention head, by name (relative
        to the encoding), with their head and layer axes: e.g. the T5 table ``rel_bias
        [layer, head, bucket]`` is ``{"rel_bias": HeadAxes(head=1, layer=0)}``. Parameters
        shared by all heads are not listed. Per-head gradients (:mod:`probes.gradients.coherence`) read it."""
        return {}

    # ---- what a probe reads of any model's positions (pe_interp.models.protocol.PositionView) ---
    # A bridge's view of its architecture's positions answers these from the bridge; every
    # encoding of ours answers them the same way, here.
    sized_spans: ClassVar[bool] = False  # rotary_spans(layer): tables covering n_ctx
    decomposes: ClassVar[bool] = True  # the logit decomposition splits every term of ours
    cannot_move: ClassVar[str | None] = None  # route shares move any head's positions
    # route shares turn a head's rotation after it (hook_rot_q/hook_rot_k fire where rotates)
    rotation_hooks: ClassVar[tuple[str, str]] = ("hook_rot_q", "hook_rot_k")
    unrotated_hooks: ClassVar[tuple[str, str] | None] = None  # only the rotated q/k are cached

    def unfrozen_norms(self, layer: int) -> list[str]:
        """Norms whose scale cannot be frozen: none (our norms hook their scale; no QK-norm)."""
        return []

    def move_bias(self, layer: int, sigma: Tensor, heads: Tensor) -> None:
        """None: our bias is hooked at ``hook_pos_bias``, where route shares move it."""
        return None

    def not_ours(self) -> str:
        """Why the logit decomposition cannot split this encoding: it can (:attr:`decomposes`)."""
        return f"{self.registry_name or type(self).__name__}: the logit decomposition splits it"

    def fused(self, layer: int, n_pos: int) -> FusedPE | None:
        """The kernel's view of this encoding in ``layer``; None when it cannot be fused.

        The default is fusible only for encodings that leave the logit alone.
        """
        if self.rotates or self.has_bias:
            return None
        return FusedPE()

    def init_parameters(self, generator: torch.Generator, std: float) -> None:
        """Deterministic initialisation of this encoding's parameters: N(0, std), or under
        ``init_mode="torch"`` N(0, 0.02) (the authors' T5 table). Override to change it;
        ``self.init_mode`` says which scheme the model uses."""
        std = 0.02 if self.init_mode == "torch" else std
        with torch.no_grad():
            for p in self.parameters(recurse=False):
                p.normal_(0.0, std, generator=generator)

    @classmethod
    def spec(cls, **params: Any) -> Any:
        """An :class:`~pe_interp.encodings.EncodingSpec` for this encoding, e.g. ``RoPE.spec(base=500)``."""
        from pe_interp.encodings import make_spec

        if not cls.registry_name:
            raise ValueError(f"{cls.__name__} is not registered; use @register_encoding(name)")
        return make_spec(cls.registry_name, params)

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


def rotary_spans_for(encoding: Any, layer: int, n_pos: int) -> tuple[RotarySpan, ...] | None:
    """``encoding.rotary_spans(layer)`` with cos/sin tables of at least ``n_pos`` rows. An encoding
    that computes its tables on demand (``sized_spans``: a bridge's,
    :class:`pe_interp.models.bridge.encoding.BridgeEncoding`) is asked for that length only, so that no
    probe's cost grows with the model's context; every other encoding's tables cover ``n_ctx``."""
    if encoding.sized_spans:
        return encoding.rotary_spans(layer, n_pos)
    return encoding.rotary_spans(layer)


def check_number(
    enc: str, name: str, value: Any, *, integer: bool = False, above: float | None = None
) -> None:
    """Raise ValueError unless ``value`` is a finite real (an int when ``integer``) > ``above``."""
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (above is not None and value <= above):
        what = "an integer" if integer else "a finite number"
        bound = f" > {above}" if above is not None else ""
        raise ValueError(f"{enc}: {name} must be {what}{bound}, got {value!r}")


def combined_kind(kinds: list[str]) -> Kind:
    """Kind of a composition: none parts are ignored; a mix of additive and multiplicative,
    or any hybrid part, makes a hybrid."""
    present = {k for k in kinds if k != "none"}
    if not present:
        return "none"
    if len(present) == 1:
        return present.pop()  # type: ignore[return-value]
    return "hybrid"


class Composite(Encoding):
    """Several encodings applied together: residuals and biases add, rotations chain.

    The authors' "rope" model is ``sinusoidal+rope``.
    """

    def __init__(self, cfg: ModelShape, parts: list[Encoding]):
        super().__init__(cfg)
        self.parts = nn.ModuleList(parts)
        if sum(p.extra_qk_dims() > 0 for p in parts) > 1:
            raise ValueError("encoding: at most one part may extend q/k (decoupled_rope)")

    @property
    def kind(self) -> Kind:  # type: ignore[override]
        return combined_kind([p.kind for p in self.parts])

    @property
    def rotates(self) -> bool:
        return any(p.rotates for p in self.parts)

    @property
    def has_bias(self) -> bool:
        return any(p.has_bias for p in self.parts)

    def extra_qk_dims(self) -> int:
        return sum(p.extra_qk_dims() for p in self.parts)

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...] | None:
        spans: list[RotarySpan] = []
        for p in self.parts:
            part = p.rotary_spans(layer)
            if part is None:
                return None
            spans += part
        return tuple(spans)

    def head_parameters(self) -> dict[str, HeadAxes]:
        return {
            f"parts.{i}.{name}": axes
            for i, p in enumerate(self.parts)
            for name, axes in p.head_parameters().items()
        }

    def residual(self, n_pos: int):
        terms = [r for p in self.parts if (r := p.residual(n_pos)) is not None]
        return sum(terms[1:], terms[0]) if terms else None

    def extend(self, x_q, x_kv, q, k, layer):
        for p in self.parts:
            q, k = p.extend(x_q, x_kv, q, k, layer)
        return q, k

    def rotate(self, q, k, layer):
        for p in self.parts:
            q, k = p.rotate(q, k, layer)
        return q, k

    def bias(self, n_q, n_k, layer):
        terms = [b for p in self.parts if (b := p.bias(n_q, n_k, layer)) is not None]
        return sum(terms[1:], terms[0]) if terms else None

    def fused(self, layer: int, n_pos: int) -> FusedPE | None:
        views = [p.fused(layer, n_pos) for p in self.parts]
        if any(v is None for v in views):
            return None
        ropes = [v.rope for v in views if v.rope is not None]
        slopes = [v.alibi_slopes for v in views if v.alibi_slopes is not None]
        rels = [v.rel_bias for v in views if v.rel_bias is not None]
        if len(ropes) > 1 or len(slopes) > 1 or len(rels) > 1:
            return None
        return FusedPE(
            rope=ropes[0] if ropes else None,
            alibi_slopes=slopes[0] if slopes else None,
            rel_bias=rels[0] if rels else None,
        )

    def init_parameters(self, generator: torch.Generator, std: float) -> None:
        for p in self.parts:
            p.init_parameters(generator, std)

    def extra_repr(self) -> str:
        return f"kind={self.kind}"

"""The positional-encoding plug-in interface, the registry, and composition.

An encoding can touch the model in up to three places, and nowhere else:

1. ``residual(n_pos)``: a vector per position, added to the token embeddings (absolute PEs);
2. ``rotate(q, k, layer)``: a per-position transform of queries and keys (RoPE);
3. ``bias(n_q, n_k, layer)``: a ``[head, q_pos, k_pos]`` term added to the attention logits
   (T5, ALiBi).

A fourth, rarer hook, ``extend(x_q, x_kv, q, k, layer)``, appends extra query/key dimensions
before rotation (MLA-style decoupled RoPE). ``pe_interp/attention.py`` is the one file where all
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

import ast
import inspect
import json
import math
import re
from dataclasses import dataclass, field
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
    ``[n_heads]``) marks the heads that are rotated; None: all of them.
    """

    start: int
    dim: int
    theta: Tensor  # [dim // 2], float64, rad/token
    cos: Tensor  # [n_ctx, dim // 2]
    sin: Tensor
    heads: Tensor | None = None

    def rotates_head(self, head: int) -> bool:
        return self.heads is None or bool(self.heads[head])


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


@dataclass(frozen=True)
class EncodingSpec:
    """A registered encoding's name plus its non-default constructor arguments."""

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.params}}

    def __str__(self) -> str:
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.name}({inner})"


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
        shared by all heads are not listed. Per-head gradients (:mod:`probes.gradients`) read it."""
        return {}

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
    def spec(cls, **params: Any) -> EncodingSpec:
        """An :class:`EncodingSpec` for this encoding, e.g. ``RoPE.spec(base=500)``."""
        if not cls.registry_name:
            raise ValueError(f"{cls.__name__} is not registered; use @register_encoding(name)")
        return make_spec(cls.registry_name, params)

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


def check_number(enc: str, name: str, value: Any, *, integer: bool = False, above: float | None = None) -> None:
    """Raise ValueError unless ``value`` is a finite real (an int when ``integer``) > ``above``."""
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (above is not None and value <= above):
        what = "an integer" if integer else "a finite number"
        bound = f" > {above}" if above is not None else ""
        raise ValueError(f"{enc}: {name} must be {what}{bound}, got {value!r}")


# ---- registry ---------------------------------------------------------------------------------
_REGISTRY: dict[str, type[Encoding]] = {}


def register_encoding(name: str):
    """Class decorator: make an :class:`Encoding` subclass available under ``name``."""

    def wrap(cls: type[Encoding]) -> type[Encoding]:
        if not (isinstance(cls, type) and issubclass(cls, Encoding)):
            raise TypeError(f"register_encoding({name!r}) expects an Encoding subclass, got {cls!r}")
        if not name or "+" in name or "(" in name:
            raise ValueError(f"encoding name {name!r} must be non-empty and contain no '+' or '('")
        if cls.kind not in KINDS:
            raise ValueError(f"{cls.__name__}.kind is {cls.kind!r}; allowed: {', '.join(KINDS)}")
        cls.registry_name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available_encodings() -> list[str]:
    return sorted(_REGISTRY)


def get_encoding_class(name: str) -> type[Encoding]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"encoding: unknown name {name!r}; allowed: {', '.join(available_encodings())} "
            "(or a '+'-joined composition of them)"
        ) from None


def _hyperparameters(cls: type[Encoding]) -> dict[str, inspect.Parameter]:
    sig = inspect.signature(cls.__init__)
    return {n: p for n, p in list(sig.parameters.items())[2:] if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD}


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def make_spec(name: str, params: dict[str, Any] | None = None) -> EncodingSpec:
    """Validate ``params`` against the encoding's constructor and return a canonical spec."""
    cls = get_encoding_class(name)
    allowed = _hyperparameters(cls)
    params = dict(params or {})
    for key in params:
        if key not in allowed:
            raise ValueError(
                f"encoding {name!r}: unknown parameter {key!r}; allowed: {', '.join(allowed) or 'none'}"
            )
    kept = tuple(
        (k, _freeze(v)) for k, v in sorted(params.items()) if v != allowed[k].default
    )
    return EncodingSpec(name, kept)


def parse_encoding(value: Any) -> tuple[EncodingSpec, ...]:
    """Normalise any accepted ``encoding=`` value into a tuple of specs.

    Accepted: a registered name, a ``+``-joined composition (``"sinusoidal+rope"``), parts with
    parameters (``"sinusoidal(layout=concat)+rope(base=500, heads=(0, 1))"``, the form
    ``str(spec)`` prints), a JSON string of a dict or list (``'{"name": "alibi", "slopes":
    "authors"}'``), an :class:`EncodingSpec`, a dict ``{"name": ..., **params}``, or a
    list/tuple of these. The command line's ``--encoding`` goes through here too.
    """
    if isinstance(value, EncodingSpec):
        return (make_spec(value.name, value.kwargs),)
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            try:
                decoded = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"encoding: invalid JSON {value!r} ({err.msg} at column {err.colno})") from None
            return parse_encoding(decoded)
        parts = _split_top(text, "+", value)
        if any(not p for p in parts):
            raise ValueError(f"encoding: malformed composition {value!r}")
        return tuple(_parse_part(p, value) for p in parts)
    if isinstance(value, dict):
        if "name" not in value:
            raise ValueError(f"encoding: a dict spec needs a 'name' key, got {value!r}")
        params = {k: v for k, v in value.items() if k != "name"}
        return (make_spec(value["name"], params),)
    if isinstance(value, list | tuple):
        specs = tuple(s for v in value for s in parse_encoding(v))
        if not specs:
            raise ValueError("encoding: empty list; use 'nope' for no positional encoding")
        return specs
    if isinstance(value, type) and issubclass(value, Encoding):
        return (value.spec(),)
    raise ValueError(
        f"encoding: cannot interpret {value!r}; give a name such as 'rope', "
        "'sinusoidal+rope', an EncodingSpec (e.g. RoPE.spec(base=500)) or a list of those"
    )


def _split_top(text: str, sep: str, whole: str) -> list[str]:
    """``text`` split at every ``sep`` outside brackets and quotes (stripped parts)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"encoding: unbalanced ')' in {whole!r}")
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth or quote:
        raise ValueError(f"encoding: unbalanced brackets or quotes in {whole!r}")
    return parts + [text[start:].strip()]


def _parse_value(text: str) -> Any:
    """A parameter value written in a spec string: a Python literal (``500``, ``1e4``,
    ``(0, 1)``, ``None``, ``'concat'``), ``true``/``false``/``null``, or else a bare word."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False, "null": None}.get(text.lower(), text)


def _parse_part(part: str, whole: str) -> EncodingSpec:
    """One part of a composition: ``name`` or ``name(key=value, ...)``."""
    match = re.fullmatch(r"([^()\s]+)\s*(?:\((.*)\))?", part, flags=re.S)
    if match is None:
        raise ValueError(f"encoding: cannot read {part!r} in {whole!r}; write name or name(key=value, ...)")
    name, inner = match.group(1), match.group(2)
    params: dict[str, Any] = {}
    for item in _split_top(inner, ",", whole) if inner and inner.strip() else []:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(
                f"encoding: parameter {item!r} of {name!r} is not key=value (e.g. rope(base=500))"
            )
        if key in params:
            raise ValueError(f"encoding: parameter {key!r} of {name!r} is given twice in {whole!r}")
        params[key] = _parse_value(raw.strip())
    return make_spec(name, params)


def given_parameters(value: Any) -> list[set[str]]:
    """The parameter names written explicitly in each part of an ``encoding=`` value, in
    :func:`parse_encoding`'s order (even those equal to the default, which a spec drops)."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            return given_parameters(json.loads(text))
        out = []
        for part in _split_top(text, "+", value):
            inner = re.fullmatch(r"[^()\s]+\s*(?:\((.*)\))?", part, flags=re.S)
            body = inner.group(1) if inner else None
            items = _split_top(body, ",", value) if body and body.strip() else []
            out.append({item.partition("=")[0].strip() for item in items})
        return out
    if isinstance(value, list | tuple):
        return [keys for part in value for keys in given_parameters(part)]
    if isinstance(value, dict):
        return [set(value) - {"name"}]
    if isinstance(value, EncodingSpec):
        return [set(value.kwargs)]
    return [set() for _ in parse_encoding(value)]


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
        return {f"parts.{i}.{name}": axes for i, p in enumerate(self.parts) for name, axes in p.head_parameters().items()}

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


def build_encoding(cfg: ModelShape) -> Encoding:
    """Instantiate the encoding a config names (a :class:`Composite` for several parts)."""
    parts = [get_encoding_class(s.name)(cfg, **s.kwargs) for s in cfg.encoding]
    return parts[0] if len(parts) == 1 else Composite(cfg, parts)

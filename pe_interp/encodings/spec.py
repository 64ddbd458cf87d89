"""Encoding specs: the registry, the spec parser, and building an encoding from a config.

An :class:`EncodingSpec` is a registered name plus the constructor arguments that differ from
their defaults; :func:`parse_encoding` reads every accepted form (names, ``+`` compositions,
``name(key=value)`` parts, JSON, dicts, specs) into a tuple of them, and :func:`build_encoding`
instantiates them for a model. ``heads=`` and ``layers=`` restrict any encoding that acts per
head (:mod:`pe_interp.encodings.restrict`). A composition that repeats an encoding is refused.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .base import KINDS, Composite, Encoding, ModelShape
from .restrict import RESTRICTIONS, Restricted


@dataclass(frozen=True)
class EncodingSpec:
    """A registered encoding's name plus its non-default constructor arguments."""

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in self.params},
        }

    def __str__(self) -> str:
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.name}({inner})"


# ---- registry ---------------------------------------------------------------------------------
_REGISTRY: dict[str, type[Encoding]] = {}


def register_encoding(name: str):
    """Class decorator: make an :class:`Encoding` subclass available under ``name``."""

    def wrap(cls: type[Encoding]) -> type[Encoding]:
        if not (isinstance(cls, type) and issubclass(cls, Encoding)):
            raise TypeError(
                f"register_encoding({name!r}) expects an Encoding subclass, got {cls!r}"
            )
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
    return {
        n: p
        for n, p in list(sig.parameters.items())[2:]
        if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
    }


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
        if key in RESTRICTIONS and key not in allowed:
            if not per_head(cls):
                raise ValueError(
                    f"encoding {name!r}: {key}= has no meaning: it enters the residual stream once, before "
                    "any head; restrict an encoding that acts per head (rope, alibi, t5, decoupled_rope)"
                )
            continue
        if key not in allowed:
            extra = [r for r in RESTRICTIONS if r not in allowed] if per_head(cls) else []
            raise ValueError(
                f"encoding {name!r}: unknown parameter {key!r}; allowed: {', '.join([*allowed, *extra]) or 'none'}"
            )
    kept = tuple(
        (k, _freeze(v))
        for k, v in sorted(params.items())
        if v != (allowed[k].default if k in allowed else None)
    )
    return EncodingSpec(name, kept)


def per_head(cls: type[Encoding]) -> bool:
    """Whether an encoding class acts per head (rotates q/k or adds a logit bias), so that
    ``heads=``/``layers=`` can restrict it."""
    return (
        cls.rotate is not Encoding.rotate
        or cls.extend is not Encoding.extend
        or cls.bias is not Encoding.bias
    )


def parse_encoding(value: Any) -> tuple[EncodingSpec, ...]:
    """Normalise any accepted ``encoding=`` value into a tuple of specs (:func:`_parse`), and refuse
    a composition that repeats an encoding or joins ``nope`` to another (:func:`check_composition`)."""
    return check_composition(_parse(value))


def check_composition(specs: tuple[EncodingSpec, ...]) -> tuple[EncodingSpec, ...]:
    """``specs`` unless a part repeats another's encoding (its position would enter twice: restrict
    one part with ``heads=``/``layers=`` instead, or merge them) or ``nope`` is joined to another
    encoding (no position and some position at once); a one-line ValueError otherwise."""
    names = [s.name for s in specs]
    if len(names) > 1 and "nope" in names:
        raise ValueError(
            f"encoding: {'+'.join(names)} joins 'nope' (no positional encoding) to another encoding; "
            "give the other alone"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(
            f"encoding: {'+'.join(names)} applies {repeated[0]!r} twice; give it once (restrict it with "
            "heads=/layers= to act on some heads)"
        )
    return specs


def _parse(value: Any) -> tuple[EncodingSpec, ...]:
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
                raise ValueError(
                    f"encoding: invalid JSON {value!r} ({err.msg} at column {err.colno})"
                ) from None
            return _parse(decoded)
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
        specs = tuple(s for v in value for s in _parse(v))
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
        raise ValueError(
            f"encoding: cannot read {part!r} in {whole!r}; write name or name(key=value, ...)"
        )
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


def build_encoding(cfg: ModelShape) -> Encoding:
    """Instantiate the encoding a config names (a :class:`Composite` for several parts)."""
    parts = []
    for s in cfg.encoding:
        cls = get_encoding_class(s.name)
        own = _hyperparameters(cls)
        native = {k: v for k, v in s.kwargs.items() if k in own}
        restriction = {k: v for k, v in s.kwargs.items() if k not in own}
        enc = cls(cfg, **native)
        parts.append(Restricted(cfg, enc, **restriction) if restriction else enc)
    return parts[0] if len(parts) == 1 else Composite(cfg, parts)

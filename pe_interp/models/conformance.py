"""What a model lacks of :class:`~pe_interp.models.protocol.ProbeModel` (:func:`missing`): the
names a probe checks before its first forward, so that a model that is not a probe model is
refused in one line that names them."""

from __future__ import annotations

import inspect
from typing import Any

from pe_interp.models.protocol import PositionView, ProbeConfig, ProbeModel


def missing(model: Any) -> list[str]:
    """The names of :class:`ProbeModel`, :class:`ProbeConfig` and :class:`PositionView` that
    ``model`` lacks (the encoding's looked up without being read: a bridge's properties run a
    forward)."""
    names = [n for n in _PROTOCOL_NAMES if not _has(model, n)]
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        names += [f"cfg.{n}" for n in ProbeConfig.__annotations__ if not _has(cfg, n)]
    if "encoding" not in names:
        enc = model.encoding
        names += [f"encoding.{n}" for n in _POSITION_NAMES if not _has_static(enc, n)]
    return names


def _has(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
    except (
        AttributeError,
        ValueError,
    ):  # a bridge's config says what it lacks with a ValueError too
        return False
    return True


def _has_static(obj: Any, name: str) -> bool:
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return False
    return True


def _names(protocol: type) -> tuple[str, ...]:
    """A protocol's names: its annotated attributes, then its methods and properties."""
    return tuple(getattr(protocol, "__annotations__", {})) + tuple(
        n
        for n, v in vars(protocol).items()
        if not n.startswith("_") and (callable(v) or isinstance(v, property))
    )


_PROTOCOL_NAMES = _names(ProbeModel)
_POSITION_NAMES = _names(PositionView)


__all__ = ["missing"]

"""Positional encodings as plug-ins. See :mod:`pe_interp.encodings.base` for the interface."""

from .absolute import Learned, NoPE, Sinusoidal, sinusoidal_table
from .base import (
    KINDS,
    Composite,
    Encoding,
    EncodingSpec,
    FusedPE,
    HeadAxes,
    ModelShape,
    RotarySpan,
    available_encodings,
    build_encoding,
    combined_kind,
    get_encoding_class,
    make_spec,
    parse_encoding,
    register_encoding,
)
from .bias import ALiBi, T5Bias, alibi_slopes, relative_positions, t5_buckets
from .rotary import DecoupledRoPE, RoPE, apply_rope, rope_angles

__all__ = [
    "KINDS",
    "ALiBi",
    "Composite",
    "DecoupledRoPE",
    "Encoding",
    "EncodingSpec",
    "FusedPE",
    "HeadAxes",
    "Learned",
    "ModelShape",
    "NoPE",
    "RoPE",
    "RotarySpan",
    "Sinusoidal",
    "T5Bias",
    "alibi_slopes",
    "apply_rope",
    "available_encodings",
    "build_encoding",
    "combined_kind",
    "get_encoding_class",
    "make_spec",
    "parse_encoding",
    "register_encoding",
    "relative_positions",
    "rope_angles",
    "sinusoidal_table",
    "t5_buckets",
]

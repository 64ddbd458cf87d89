"""Positional encodings as plug-ins. See :mod:`pe_interp.encodings.base` for the interface."""

from .absolute import Learned, NoPE, Sinusoidal, sinusoidal_table
from .base import (
    KINDS,
    Composite,
    Encoding,
    FusedPE,
    HeadAxes,
    ModelShape,
    RotarySpan,
    combined_kind,
    rotary_spans_for,
)
from .bias import ALiBi, T5Bias, alibi_slopes, relative_positions, t5_buckets
from .restrict import RESTRICTIONS, Restricted
from .rotary import DecoupledRoPE, RoPE, apply_rope, rope_angles
from .spec import (
    EncodingSpec,
    available_encodings,
    build_encoding,
    get_encoding_class,
    given_parameters,
    make_spec,
    parse_encoding,
    per_head,
    register_encoding,
)

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
    "RESTRICTIONS",
    "Restricted",
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
    "given_parameters",
    "make_spec",
    "parse_encoding",
    "per_head",
    "register_encoding",
    "relative_positions",
    "rope_angles",
    "rotary_spans_for",
    "sinusoidal_table",
    "t5_buckets",
]

"""Fused attention kernels with positional encodings (RoPE, ALiBi, T5-style table bias).

Importing this package never imports Triton or touches a GPU driver; the Triton kernels are
built on the first :func:`fused_attention` call. Set ``TRITON_INTERPRET=1`` before that first
call to run them on CPU tensors with the Triton interpreter (tests do this).
"""

from .flash import TritonUnavailableError, fused_attention, triton_available
from .reference import rebuild_pattern, reference_attention
from .specs import RelBiasSpec, RopeSpec

__all__ = [
    "RelBiasSpec",
    "RopeSpec",
    "TritonUnavailableError",
    "fused_attention",
    "rebuild_pattern",
    "reference_attention",
    "triton_available",
]

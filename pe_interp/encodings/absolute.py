"""Absolute encodings: a vector per position added to the residual stream (or nothing)."""

from __future__ import annotations

import torch
from torch import nn

from .base import Encoding, ModelShape, check_number
from .spec import register_encoding


@register_encoding("nope")
class NoPE(Encoding):
    """No positional information at all. With a padding mask, bidirectional attention and mean
    pooling, the model is invariant to permutations of its input."""

    kind = "none"


def sinusoidal_table(n_pos: int, d_model: int, base: float = 10000.0, layout: str = "interleaved"):
    """Vaswani et al.'s table: ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(...)``.

    ``layout="concat"`` puts all sines first, then all cosines, as the authors' code does.
    """
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = pos * inv_freq  # [pos, d_model/2]
    if layout == "interleaved":
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return table[:, :d_model].float()


@register_encoding("sinusoidal")
class Sinusoidal(Encoding):
    """Fixed sinusoidal absolute positions (additive)."""

    kind = "additive"

    def __init__(self, cfg: ModelShape, base: float = 10000.0, layout: str = "interleaved"):
        super().__init__(cfg)
        check_number("sinusoidal", "base", base, above=1)
        if layout not in ("interleaved", "concat"):
            raise ValueError(
                f"sinusoidal: layout must be 'interleaved' or 'concat', got {layout!r}"
            )
        if cfg.d_model % 2:
            raise ValueError(f"sinusoidal: d_model must be even, got {cfg.d_model}")
        self.base, self.layout = base, layout
        self.register_buffer(
            "table", sinusoidal_table(cfg.n_ctx, cfg.d_model, base, layout), persistent=False
        )

    def residual(self, n_pos: int):
        return self.table[:n_pos]


@register_encoding("learned")
class Learned(Encoding):
    """A learned vector per absolute position (the authors' "random" PE is this, randomly
    initialised and trained)."""

    kind = "additive"

    def __init__(self, cfg: ModelShape):
        super().__init__(cfg)
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def residual(self, n_pos: int):
        return self.W_pos[:n_pos]

    def init_parameters(self, generator: torch.Generator, std: float) -> None:
        # init_mode="torch": nn.Embedding's N(0, 1), as the authors' learned ("random") PE.
        with torch.no_grad():
            self.W_pos.normal_(0.0, 1.0 if self.init_mode == "torch" else std, generator=generator)


__all__ = ["NoPE", "Sinusoidal", "Learned", "sinusoidal_table"]

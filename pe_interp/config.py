"""Model configuration: a frozen dataclass that validates itself when it is built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from pe_interp.encodings import EncodingSpec, combined_kind, get_encoding_class, parse_encoding

ACT_FNS = ("relu", "gelu", "silu")
NORMS = ("LN", "RMS", None)
ATTENTION_DIRS = ("bidirectional", "causal")
POOLINGS = ("mean", "first", "last")
BACKENDS = ("auto", "eager", "sdpa", "triton")
KV_SOURCES = ("residual", "embed")


def check_int(owner: str, name: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}.{name} must be an integer >= {low}, got {value!r}")


def check_float(owner: str, name: str, value: Any, low: float, high: float, high_open: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and low <= value and (value < high if high_open else value <= high)
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(f"{owner}.{name} must be a number in [{low}, {high}{bracket}, got {value!r}")


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def check_choice(owner: str, name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a :class:`~pe_interp.HookedPETransformer`.

    Field names follow TransformerLens where it has one (``d_model``, ``d_head``, ``d_mlp``,
    ``n_ctx``, ``d_vocab``, ``act_fn``, ``normalization_type``, ``attention_dir``).

    Fidelity switches that reproduce the authors' released code (paper digest §9):

    - ``mask_padding`` (default True). When False, pad tokens are attended to and pooled, as in
      the authors' code; the pad count then leaks the sequence length.
    - ``kv_source`` (default ``"residual"``). ``"embed"`` computes every layer's keys and values
      from the layer-0 input (token embedding plus any residual positional encoding, not
      normalised), as the authors' code does; only queries read the residual stream.
    - The authors' "rope" model is ``encoding="sinusoidal+rope"``; their ALiBi slopes are
      ``{"name": "alibi", "slopes": "authors"}``.
    """

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_head: int | None = None  # default: d_model // n_heads
    d_mlp: int | None = None  # default: 4 * d_model; 0 means attention-only blocks
    n_ctx: int = 128
    d_vocab: int = 512
    n_classes: int = 70
    act_fn: str = "gelu"
    normalization_type: str | None = "LN"
    final_norm: bool = True
    attention_dir: str = "bidirectional"
    pooling: str = "mean"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    seed: int = 0
    init_std: float = 0.02
    attn_backend: str = "auto"
    encoding: Any = "rope"
    mask_padding: bool = True
    kv_source: str = "residual"
    pad_id: int = 0
    eps: float = 1e-5
    device: str = field(default="cpu", compare=False)

    def __post_init__(self) -> None:
        own = "ModelConfig"
        for name in ("n_layers", "d_model", "n_heads", "n_ctx", "d_vocab"):
            check_int(own, name, getattr(self, name))
        check_int(own, "n_classes", self.n_classes, low=2)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"{own}.d_head: d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "set d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        check_int(own, "d_head", self.d_head)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        check_int(own, "d_mlp", self.d_mlp, low=0)
        check_choice(own, "act_fn", self.act_fn, ACT_FNS)
        check_choice(own, "normalization_type", self.normalization_type, NORMS)
        check_choice(own, "attention_dir", self.attention_dir, ATTENTION_DIRS)
        check_choice(own, "pooling", self.pooling, POOLINGS)
        check_choice(own, "attn_backend", self.attn_backend, BACKENDS)
        check_choice(own, "kv_source", self.kv_source, KV_SOURCES)
        check_bool(own, "final_norm", self.final_norm)
        check_bool(own, "mask_padding", self.mask_padding)
        check_float(own, "dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_float(own, "attn_dropout", self.attn_dropout, 0.0, 1.0, high_open=True)
        check_float(own, "init_std", self.init_std, 1e-6, 10.0)
        check_float(own, "eps", self.eps, 0.0, 1.0)
        check_int(own, "seed", self.seed, low=0)
        check_int(own, "pad_id", self.pad_id, low=0)
        if self.pad_id >= self.d_vocab:
            raise ValueError(f"{own}.pad_id must be < d_vocab={self.d_vocab}, got {self.pad_id}")
        if not isinstance(self.device, str) or self.device.split(":")[0] not in ("cpu", "cuda", "mps"):
            raise ValueError(f"{own}.device must be 'cpu', 'cuda[:N]' or 'mps', got {self.device!r}")
        try:
            specs = parse_encoding(self.encoding)
        except ValueError as err:
            raise ValueError(f"{own}.{err}") from None
        object.__setattr__(self, "encoding", specs)
        # Let each encoding check its parameters against the model's shape now, on the meta
        # device so that nothing is allocated.
        from pe_interp.encodings import build_encoding

        try:
            with torch.device("meta"):
                build_encoding(self)
        except (ValueError, TypeError, IndexError) as err:
            raise ValueError(f"{own}.encoding: {err}") from None
        if self.attn_backend == "triton" and self.attn_dropout > 0:
            raise ValueError(
                f"{own}.attn_dropout: the triton backend has no attention dropout; "
                "use attn_backend='auto' (which falls back to sdpa while training) or 'sdpa'"
            )

    # ---- derived -------------------------------------------------------------------------
    @property
    def encoding_name(self) -> str:
        """Readable composition, e.g. ``"sinusoidal+rope(base=500)"``."""
        return "+".join(str(s) for s in self.encoding)

    @property
    def encoding_kind(self) -> str:
        return combined_kind([get_encoding_class(s.name).kind for s in self.encoding])

    @property
    def attn_only(self) -> bool:
        """TransformerLens compatibility (``ActivationCache.decompose_resid``): no MLPs."""
        return self.d_mlp == 0

    @property
    def n_key_value_heads(self) -> None:
        """TransformerLens compatibility: no grouped-query attention here."""
        return None

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "device"}
        out["encoding"] = [s.to_json() for s in self.encoding]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes``; ``d_head`` and ``d_mlp`` that were defaults follow the new
        ``d_model``/``n_heads`` unless given."""
        resized = "d_model" in changes or "n_heads" in changes
        if resized and "d_head" not in changes and self.d_head == self.d_model // self.n_heads:
            changes["d_head"] = None
        if "d_model" in changes and "d_mlp" not in changes and self.d_mlp == 4 * self.d_model:
            changes["d_mlp"] = None
        return dataclasses.replace(self, **changes)


__all__ = ["ModelConfig", "EncodingSpec"]

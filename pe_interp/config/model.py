"""Model configuration: a frozen dataclass that validates itself when it is built.

The training configuration is :mod:`pe_interp.config.train`, the device checks both share are in
:mod:`pe_interp.config.checks` (all importable from here).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from pe_interp.config.checks import (
    DEVICE_FORMS,
    check_device,
    check_mapping,
    default_device,
    device_syntax_ok,
)
from pe_interp.config.train import LR_SCHEDULES, TrainConfig
from pe_interp.encodings import EncodingSpec, combined_kind, get_encoding_class, parse_encoding
from pe_interp.util.checks import (
    check_bool,
    check_choice,
    check_float,
    check_head_pairs,
    check_int,
    check_seed,
)

ARCH_ENCODINGS = {
    "gpt2": ("learned absolute", "additive"),
    "gpt-neox": ("partial rotary", "multiplicative"),
    "llama": ("rope", "multiplicative"),
    "bloom": ("alibi", "additive"),
}
ACT_FNS = ("relu", "gelu", "silu")
NORMS = ("LN", "RMS", None)
ATTENTION_DIRS = ("bidirectional", "causal")
POOLINGS = ("mean", "first", "last")
BACKENDS = ("auto", "eager", "sdpa", "triton")
KV_SOURCES = ("residual", "embed")
INIT_MODES = ("normal", "torch")
# TransformerLens' optional hook switches: runtime state of a model, not part of what defines it
# (never saved, never compared). Set them with ``model.set_use_*``.
RUNTIME_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")
# Why TransformerLens' k/v edge tools refuse a kv_source="embed" model (one line).
KV_EMBED_NO_EDGES = (
    "kv_source='embed': every layer's keys and values read the layer-0 input, so no head or MLP "
    "writes into a k/v input; TransformerLens' k/v direct-path patching, edge attribution and "
    "faithfulness would patch or score edges that do not exist (q direct paths and node "
    "attribution are available)"
)


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
    - ``init_mode`` (default ``"normal"``: every weight N(0, ``init_std``), biases zero).
      ``"torch"`` is PyTorch's default initialisation, as the authors' model gets it: token
      embeddings N(0, 1), every projection's weight and bias U(±1/√fan_in), a learned absolute
      position table N(0, 1), the T5 table N(0, 0.02).
    - ``embed_dropout`` (default None: the same as ``dropout``). The authors drop out the
      attention weights (``attn_dropout``), the attention output and the MLP output
      (``dropout``), but not the embeddings (``embed_dropout=0``).
    - ``act_fn="relu"`` and ``final_norm=False`` are the authors' MLP and readout.
    - The authors' "rope" model is ``sinusoidal(layout=concat)+rope``; their ALiBi slopes are
      ``{"name": "alibi", "slopes": "authors"}``. ``pe_interp.config.presets.AUTHORS_QUIRKS`` and
      ``authors_quirks=True`` set all of these at once.

    TransformerLens' optional per-head hooks (``attn.hook_result``, ``attn.hook_q/k/v_input``,
    ``attn.hook_attn_in``, ``hook_mlp_in``) fire when their ``use_*`` flag is on; the flags are
    runtime switches (``model.set_use_attn_result(True)``...), never saved with a run.
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
    embed_dropout: float | None = None  # None: same as dropout
    seed: int = 0
    init_std: float = 0.02
    init_mode: str = "normal"
    attn_backend: str = "auto"
    encoding: Any = "rope"
    mask_padding: bool = True
    # heads that write nothing by construction: W_V, b_V and W_O start at zero, where every
    # gradient of theirs is zero too, so they stay zero through training (a planted model's part)
    silent_heads: tuple[tuple[int, int], ...] = ()
    kv_source: str = "residual"
    pad_id: int = 0
    arch: str | None = (
        None  # a Hugging Face architecture in language-model form (pe_interp.models.bridge.hf_arch)
    )
    eps: float = 1e-5
    device: str = field(default="cpu", compare=False)
    use_attn_result: bool = field(default=False, compare=False)
    use_split_qkv_input: bool = field(default=False, compare=False)
    use_attn_in: bool = field(default=False, compare=False)
    use_hook_mlp_in: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        self._check_shape()
        self._check_settings()
        self._check_encoding()
        own = "ModelConfig"
        if self.attn_backend == "triton" and self.attn_dropout > 0:
            raise ValueError(
                f"{own}.attn_dropout: the triton backend has no attention dropout; "
                "use attn_backend='auto' (which falls back to sdpa while training) or 'sdpa'"
            )

    def _check_shape(self) -> None:
        """The sizes; ``d_head`` defaults to d_model / n_heads and ``d_mlp`` to 4 d_model."""
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

    def _check_settings(self) -> None:
        """The choices, flags, rates, seeds, pad id, silent heads and device."""
        own = "ModelConfig"
        check_choice(own, "act_fn", self.act_fn, ACT_FNS)
        check_choice(own, "normalization_type", self.normalization_type, NORMS)
        check_choice(own, "attention_dir", self.attention_dir, ATTENTION_DIRS)
        check_choice(own, "pooling", self.pooling, POOLINGS)
        check_choice(own, "attn_backend", self.attn_backend, BACKENDS)
        check_choice(own, "kv_source", self.kv_source, KV_SOURCES)
        check_choice(own, "init_mode", self.init_mode, INIT_MODES)
        for name in RUNTIME_FLAGS:
            check_bool(own, name, getattr(self, name))
        if self.use_attn_in and (self.use_split_qkv_input or self.kv_source == "embed"):
            why = (
                "use_split_qkv_input is on"
                if self.use_split_qkv_input
                else "kv_source='embed' gives k and v their own input"
            )
            raise ValueError(f"{own}.use_attn_in: q, k and v have no single shared input ({why})")
        check_bool(own, "final_norm", self.final_norm)
        check_bool(own, "mask_padding", self.mask_padding)
        check_float(own, "dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_float(own, "attn_dropout", self.attn_dropout, 0.0, 1.0, high_open=True)
        if self.embed_dropout is not None:
            check_float(own, "embed_dropout", self.embed_dropout, 0.0, 1.0, high_open=True)
        check_float(own, "init_std", self.init_std, 1e-6, 10.0)
        check_float(own, "eps", self.eps, 0.0, 1.0)
        check_seed(own, "seed", self.seed)
        check_int(own, "pad_id", self.pad_id, low=0)
        object.__setattr__(
            self,
            "silent_heads",
            check_head_pairs(own, "silent_heads", self.silent_heads, self.n_layers, self.n_heads),
        )
        if self.pad_id >= self.d_vocab:
            raise ValueError(f"{own}.pad_id must be < d_vocab={self.d_vocab}, got {self.pad_id}")
        if not device_syntax_ok(self.device):
            raise ValueError(f"{own}.device must be {DEVICE_FORMS}, got {self.device!r}")

    def _check_encoding(self) -> None:
        """Parse the encoding and let it check its parameters against the model's shape now, on
        the meta device so that nothing is allocated; an ``arch`` brings its own."""
        own = "ModelConfig"
        try:
            specs = parse_encoding(self.encoding)
        except ValueError as err:
            raise ValueError(f"{own}.{err}") from None
        object.__setattr__(self, "encoding", specs)
        from pe_interp.encodings import build_encoding

        try:
            with torch.device("meta"):
                build_encoding(self)
        except (ValueError, TypeError, IndexError) as err:
            raise ValueError(f"{own}.encoding: {err}") from None
        if self.arch is not None:
            check_choice(own, "arch", self.arch, tuple(ARCH_ENCODINGS))
            if (
                self.silent_heads
                or [str(e) for e in self.encoding] != ["rope"]
                or self.d_head * self.n_heads != self.d_model
            ):
                raise ValueError(
                    f"{own}.arch: {self.arch!r} brings its own position encoding and heads (d_head = d_model "
                    "/ n_heads); leave encoding, silent_heads and d_head at their defaults"
                )

    # ---- derived -------------------------------------------------------------------------
    @property
    def encoding_name(self) -> str:
        """Readable composition, e.g. ``"sinusoidal+rope(base=500)"`` (an ``arch``'s own: ``"llama: rope"``)."""
        if self.arch is not None:
            return f"{self.arch}: {ARCH_ENCODINGS[self.arch][0]}"
        return "+".join(str(s) for s in self.encoding)

    @property
    def encoding_kind(self) -> str:
        if self.arch is not None:
            return ARCH_ENCODINGS[self.arch][1]
        return combined_kind([get_encoding_class(s.name).kind for s in self.encoding])

    @property
    def embed_dropout_p(self) -> float:
        """The dropout probability applied to the embeddings."""
        return self.dropout if self.embed_dropout is None else self.embed_dropout

    @property
    def attn_only(self) -> bool:
        """TransformerLens compatibility (``ActivationCache.decompose_resid``): no MLPs."""
        return self.d_mlp == 0

    @property
    def n_key_value_heads(self) -> None:
        """TransformerLens compatibility: no grouped-query attention here."""
        return None

    @property
    def per_layer_num_key_value_heads(self) -> None:
        """TransformerLens compatibility: None (every layer has ``n_heads`` k/v heads).

        TransformerLens reads this only before patching or scoring edges from the residual stream
        into per-head k/v inputs (``get_act_patch_direct_path(component="k"/"v")``,
        ``attribution_patch(granularity="edge")``, ``faithfulness``). With ``kv_source="embed"``
        no such edge exists (keys and values read the layer-0 input), so it raises
        :data:`KV_EMBED_NO_EDGES` instead of letting those tools patch or score edges that are not
        in the model.
        """
        if self.kv_source == "embed":
            raise ValueError(KV_EMBED_NO_EDGES)
        return None

    # ---- what the probes read of every model (ProbeConfig), fixed for ours --------------------
    @property
    def n_kv_heads(self) -> int:
        """One key/value head per query head (a bridge's grouped model has fewer)."""
        return self.n_heads

    @property
    def parallel_attn_mlp(self) -> bool:
        """False: a block's MLP reads the residual stream after its attention."""
        return False

    @property
    def embed_hook(self) -> str:
        """Where the circuit probes read the embedding writer: the token embedding's hook."""
        return "hook_embed"

    @property
    def mlp_in_hook(self) -> str:
        """``blocks.{l}.<this>``: the MLP's own copy of its input (``use_hook_mlp_in``)."""
        return "hook_mlp_in"

    @property
    def mlp_out_hook(self) -> str:
        """``blocks.{l}.<this>``: an MLP's writer term, its output (no norm follows it here)."""
        return "hook_mlp_out"

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        skip = {"device", *RUNTIME_FLAGS}
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip
        }
        out["encoding"] = [s.to_json() for s in self.encoding]
        out["silent_heads"] = [list(p) for p in self.silent_heads]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        check_mapping("ModelConfig", data)
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


def check_run_configs(model_cfg: ModelConfig, train_cfg: TrainConfig) -> None:
    """What neither config can check alone: ``TrainConfig.ignore_index`` must be one of the
    model's classes (a class that never occurs would silently count every class)."""
    ii = train_cfg.ignore_index
    if ii is not None and ii >= model_cfg.n_classes:
        raise ValueError(
            f"TrainConfig.ignore_index must be a class of the task, in 0..{model_cfg.n_classes - 1}, "
            f"got {ii}"
        )


__all__ = [
    "LR_SCHEDULES",
    "EncodingSpec",
    "ModelConfig",
    "TrainConfig",
    "check_device",
    "check_run_configs",
    "default_device",
]

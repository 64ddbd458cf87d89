"""What the probes read of a bridge's configuration (:class:`BridgeConfig`, under
:class:`~pe_interp.ModelConfig`'s names) and what they cannot (:class:`NotOnABridge`, a one-line
error): the configuration of :class:`~pe_interp.models.bridge.model.BridgedModel`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Hugging Face model_type -> our name of the architecture (ModelConfig.arch, pe-interp train --arch)
ARCH_OF = {"gpt2": "gpt2", "gpt_neox": "gpt-neox", "llama": "llama", "bloom": "bloom"}


class NotOnABridge(AttributeError, ValueError):
    """What a probe reads of our own model but a bridge lacks: an AttributeError (``hasattr`` and
    ``getattr(..., default)`` still answer) that the command line reports as a one-line error."""


@dataclass(frozen=True)
class BridgeConfig:
    """The part of a bridge's configuration the probes read, under :class:`~pe_interp.ModelConfig`'s names."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    d_mlp: int
    n_ctx: int
    pad_id: int  # -1: the tokenizer has no pad token, so no row may be padded
    n_classes: int
    model_type: str
    n_kv_heads: int
    encoding_name: str
    encoding_kind: str
    mask_padding: bool = True  # right pads reach no real token of a causal model
    kv_source: str = "residual"
    attention_dir: str = "causal"
    parallel_attn_mlp: bool = False  # GPT-NeoX: a block's attention and MLP read the same input
    # where the circuit probes read the embedding writer, an MLP's own input and its term on a
    # bridge: the layer-0 input (after BLOOM's embedding norm, Gemma's scaling), ln2's input (the
    # residual add reads its own copy) and hook_mlp_out, or as forward.mlp_hooks finds them
    embed_hook: str = "blocks.0.hook_resid_pre"
    mlp_in_hook: str = "ln2.hook_in"
    mlp_out_hook: str = "hook_mlp_out"
    flags: Any = field(
        default=None, repr=False, compare=False
    )  # the bridge's own cfg, for the fork flags

    @property
    def use_split_qkv_input(self) -> bool:
        return bool(getattr(self.flags, "use_split_qkv_input", False))

    @property
    def use_attn_in(self) -> bool:
        return bool(getattr(self.flags, "use_attn_in", False))

    @property
    def use_hook_mlp_in(self) -> bool:
        return bool(getattr(self.flags, "use_hook_mlp_in", False))

    def __getattr__(self, name: str) -> Any:  # only called for a field the bridge lacks
        raise NotOnABridge(
            f"a TransformerLens bridge ({self.encoding_name}) has no {name!r} setting, which this probe "
            "reads of pe_interp's own model; ablation, patching, attribution, circuits and dynamics run on it"
        )


__all__ = ["ARCH_OF", "BridgeConfig", "NotOnABridge"]

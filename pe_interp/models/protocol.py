"""The seam between a model and the probes: what a probe may ask of any model, named once.

Two kinds of model implement :class:`ProbeModel` today: our own
:class:`~pe_interp.HookedPETransformer` and a TransformerLens bridge seen as a classifier,
:class:`pe_interp.models.bridge.model.BridgedModel`. A probe reads a model through this Protocol only, so what
it may ask is known before it runs, and a third kind (a pretrained bridge with grouped key/value
heads, say) is checked against the same list. :func:`probes.common.inputs.as_probe_model` checks a model
against it at a probe's door (and wraps a raw ``TransformerBridge`` there).

What the Protocol holds:

- ``cfg`` (:class:`ProbeConfig`): the shape, the pad id, the classes, how padding and keys behave;
- ``encoding`` (:class:`PositionView`): where the positions enter, as route shares and the logit
  decomposition read them;
- the hook names (:data:`HOOKS`, TransformerLens' vocabulary) and :func:`layer_of`;
- the forward: :meth:`ProbeModel.check_inputs` once, then :meth:`ProbeModel.forward_unchecked`;
  ``run_with_hooks``, ``run_with_cache`` and ``hooks`` as in TransformerLens;
- where the forward restarts (:attr:`ProbeModel.restart`, :class:`Restart`);
- the key/value-head layout (:attr:`ProbeModel.kv_layout`, :class:`KVLayout`);
- the per-head forks of the circuit probes: TransformerLens' ``set_use_split_qkv_input``,
  ``set_use_attn_in`` and ``set_use_hook_mlp_in``, and :meth:`ProbeModel.check_forks`;
- a norm after a block's attention or MLP (:meth:`ProbeModel.post_norm`, :class:`PostNorm`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from pe_interp.encodings.base import HeadAxes, RotarySpan

Restart = Literal["resid_mid", "resid_pre", "embed"]
"""Where a model's forward can start again, from the finest seam to none:

- ``"resid_mid"``: :meth:`ProbeModel.forward_unchecked` takes ``start_at_layer``, ``residual`` and
  ``start_at="resid_mid"``: a layer's input, or the output of its attention (our own model);
- ``"resid_pre"``: :meth:`ProbeModel.resume` restarts at a layer's input exactly (a bridge whose
  architecture was checked to resume exactly);
- ``"embed"``: every forward runs from the embedding.
"""
RESTARTS: tuple[str, ...] = get_args(Restart)


@dataclass(frozen=True)
class KVLayout:
    """How query heads share key/value heads: ``n_kv_heads`` groups of ``n_heads / n_kv_heads``
    consecutive query heads (grouped-query attention; one group per head is multi-head, one
    group in all is multi-query). ``hook_k``/``hook_v`` carry ``n_kv_heads`` heads."""

    n_heads: int
    n_kv_heads: int

    def __post_init__(self) -> None:
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.n_heads} query heads cannot share {self.n_kv_heads} key/value heads evenly"
            )

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def grouped(self) -> bool:
        """Whether a key/value head serves more than one query head."""
        return self.n_kv_heads < self.n_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` reads."""
        return head // self.group

    def query_heads(self, kv_head: int) -> range:
        """The query heads that read key/value head ``kv_head``."""
        return range(kv_head * self.group, (kv_head + 1) * self.group)

    def per_query_head(self, x: Tensor, dim: int = 2) -> Tensor:
        """``x`` with its key/value heads (axis ``dim``) repeated to one per query head, as Hugging
        Face's ``repeat_kv`` does (a view-free copy only where grouped)."""
        return x.repeat_interleave(self.group, dim=dim) if self.grouped else x


class ProbeConfig(Protocol):
    """What a probe reads of a model's configuration (:class:`pe_interp.ModelConfig` and
    :class:`pe_interp.models.bridge.config.BridgeConfig` have all of it)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int  # key/value heads, shared by groups of query heads where fewer (a bridge's)
    d_head: int
    d_model: int
    d_mlp: int  # 0: attention-only blocks
    d_vocab: int
    n_ctx: int
    pad_id: int  # -1: no row may be padded
    n_classes: int
    encoding_name: str
    encoding_kind: str
    mask_padding: bool  # pads reach no real token (so a chunk may be cut to its longest row)
    kv_source: str  # "residual", or "embed": every layer's keys and values read the layer-0 input
    attention_dir: str  # "causal" or "bidirectional"
    parallel_attn_mlp: bool  # a block's attention and MLP read the same input (GPT-NeoX)
    # where the circuit probes read the embedding writer (a hook name), each MLP's own input and
    # its writer term (blocks.{l}.<this>, inside a norm after the MLP where the model has one):
    # TransformerLens' hook_embed, hook_mlp_in and hook_mlp_out on our own model
    embed_hook: str
    mlp_in_hook: str
    mlp_out_hook: str
    # TransformerLens' fork flags, as the circuit probes find and restore them
    # (ProbeModel.set_use_split_qkv_input and the rest)
    use_split_qkv_input: bool
    use_attn_in: bool
    use_hook_mlp_in: bool


@runtime_checkable
class PositionView(Protocol):
    """What a probe reads of a model's positional encoding (``model.encoding``): every encoding of
    ours (:class:`pe_interp.encodings.Encoding`, whose base class gives the defaults below) and a
    bridge's view of its architecture's positions
    (:class:`pe_interp.models.bridge.encoding.BridgeEncoding`) have all of it.

    Where the positions enter: ``residual`` (a vector per position), ``rotate`` (queries and keys
    turned by position, :meth:`rotary_spans` saying how), ``bias`` (a term of the attention
    logits). What a probe may do with them: :attr:`decomposes` (the logit decomposition splits
    them, else :meth:`not_ours` says why), :attr:`cannot_move` (route shares move one head's
    positions, at :attr:`rotation_hooks` or with :meth:`move_bias`).

    ``isinstance(x, PositionView)`` checks that every name is there; on Python 3.11 it reads the
    properties to do so, which on a bridge runs its one checking forward (cached)."""

    @property
    def sized_spans(self) -> bool:
        """Whether :meth:`rotary_spans` takes ``(layer, n_pos)`` and computes tables of ``n_pos``
        rows only (a bridge's); else its tables cover the model's context
        (:func:`pe_interp.encodings.rotary_spans_for` asks the right way)."""
        ...

    @property
    def rotates(self) -> bool:
        """Whether :meth:`rotate` turns the queries and keys (``hook_rot_q``/``hook_rot_k``)."""
        ...

    @property
    def has_bias(self) -> bool:
        """Whether :meth:`bias` adds a term to the attention logits."""
        ...

    @property
    def decomposes(self) -> bool:
        """Whether the logit decomposition splits this encoding's terms (ours always; a bridge's
        where one checking forward shows it can); :meth:`not_ours` says why not."""
        ...

    @property
    def cannot_move(self) -> str | None:
        """Why route shares cannot move one head's positions, in one line (None: they can)."""
        ...

    @property
    def rotation_hooks(self) -> tuple[str, str]:
        """The q/k hooks (``hook_…`` names in ``blocks.{l}.attn``) where route shares turn a
        head's rotation to new positions (ours: ``hook_rot_q``/``hook_rot_k``)."""
        ...

    @property
    def unrotated_hooks(self) -> tuple[str, str] | None:
        """The q/k hooks holding the queries and keys right before the rotation, read as the
        decomposition's direct term (a bridge's ``hook_q``/``hook_k``); None where only the
        rotated ones are cached (ours), and the rotation is undone with the tables instead."""
        ...

    def residual(self, n_pos: int) -> Tensor | None:
        """The vector added to the token embedding at each position ``[n_pos, d_model]``, or None."""
        ...

    def rotate(self, q: Tensor, k: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """``q``, ``k`` ``[batch, pos, head, d]`` turned by position as the model turns them."""
        ...

    def bias(self, n_q: int, n_k: int, layer: int) -> Tensor | None:
        """The term ``[head, n_q, n_k]`` added to layer ``layer``'s attention logits, or None."""
        ...

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...] | None:
        """The rotated spans of ``layer`` with their frequencies and tables (``()``: nothing is
        rotated; None: rotated without saying how). :attr:`sized_spans` says whether a length may
        be asked too."""
        ...

    def head_parameters(self) -> dict[str, HeadAxes]:
        """The encoding's parameters holding one slice per head, by name under ``encoding.``
        (per-head gradients read them; none on a bridge)."""
        ...

    def unfrozen_norms(self, layer: int) -> list[str]:
        """The norms on the way to ``layer``'s queries and keys whose scale cannot be frozen at its
        value, each with why (a QK-norm whose scale the model does not hook, ``attn.q_norm.hook_scale``;
        a norm the model cannot run with its scale edited), so that the layer-0 decomposition
        cannot make that path affine (none in ours)."""
        ...

    def move_bias(
        self, layer: int, sigma: Tensor, heads: Tensor
    ) -> Callable[[Tensor, Any], Tensor] | None:
        """A ``hook_attn_scores`` hook letting ``heads [batch, head]`` see positions ``sigma
        [batch, pos]`` where the bias is added inside the scores with no hook of its own (a
        bridge's ALiBi); None where the bias is hooked at ``hook_pos_bias`` (ours), which route
        shares move there."""
        ...

    def not_ours(self) -> str:
        """Why the logit decomposition cannot split this encoding's terms, in one line (read where
        :attr:`decomposes` is False)."""
        ...


class _Hooks:
    """TransformerLens' hook names, the ones the probes use (``HOOKS.z(3)`` is
    ``"blocks.3.attn.hook_z"``)."""

    embed = "hook_embed"
    pos_embed = "hook_pos_embed"

    @staticmethod
    def resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def resid_mid(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_mid"

    @staticmethod
    def resid_post(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    @staticmethod
    def attn(layer: int, name: str) -> str:
        """``blocks.{layer}.attn.hook_{name}`` (``z``, ``q``, ``k``, ``v``, ``pattern``, ...)."""
        return f"blocks.{layer}.attn.hook_{name}"

    def z(self, layer: int) -> str:
        return self.attn(layer, "z")


HOOKS = _Hooks()


def layer_of(hook: Any) -> int:
    """The layer of a hook point named ``blocks.{layer}.…`` (TransformerLens' ``HookPoint.layer``)."""
    return int(hook.layer())


@dataclass(frozen=True)
class PostNorm:
    """A norm a block applies to one branch's output before the residual adds it (Gemma 2 and 3,
    OLMo 2: ``resid += norm(sum_h z_h W_O[h] + b_O)``, ``resid += norm(mlp_out)``)."""

    hook_in: str
    """The hook that reads the norm's input, the branch's output (``blocks.{l}.ln1_post.hook_in``)."""
    norm: Callable[[Tensor], Tensor]
    """The model's own norm, on any leading axes (``[..., d_model]``); it fires no hook."""


@runtime_checkable
class ProbeModel(Protocol):
    """What a probe may ask of a model (module docstring). ``isinstance(model, ProbeModel)``
    checks that every name is there; the meanings are in the docstrings."""

    cfg: ProbeConfig
    restart: Restart
    encoding: PositionView
    kv_layout: KVLayout
    W_E: Tensor
    blocks: Any  # blocks[l].attn.W_O [n_heads, d_head, d_model], b_O

    @property
    def can_restart(self) -> bool:
        """Whether :meth:`forward_unchecked` restarts inside a layer (``restart == "resid_mid"``)."""
        ...

    @property
    def can_resume(self) -> bool:
        """Whether the forward restarts exactly at a layer's input (:meth:`resume`)."""
        ...

    def check_inputs(self, tokens: Tensor, pad_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``(tokens, key_valid)`` checked once: int64 ids, and the pad mask (None: no pads)."""
        ...

    def forward_unchecked(self, tokens: Tensor, key_valid: Tensor | None, **restart: Any) -> Tensor:
        """Class logits ``[batch, n_classes]`` of inputs :meth:`check_inputs` checked; the restart
        keywords (``start_at_layer``, ``residual``, ``start_at``) only where :attr:`can_restart`."""
        ...

    def resume(
        self,
        tokens: Tensor,
        layer: int,
        residual: Tensor,
        key_valid: Tensor | None,
        fwd_hooks: Sequence = (),
    ) -> Tensor:
        """Class logits of the forward restarted at ``blocks.{layer}.hook_resid_pre`` =
        ``residual`` with ``fwd_hooks`` (where :attr:`can_resume`)."""
        ...

    def run_with_hooks(
        self, tokens: Tensor, pad_mask: Tensor | None = None, **kwargs: Any
    ) -> Tensor:
        """TransformerLens' ``run_with_hooks``, returning class logits."""
        ...

    def run_with_cache(self, tokens: Tensor, pad_mask: Tensor | None = None, **kwargs: Any) -> Any:
        """TransformerLens' ``run_with_cache``: ``(class logits, ActivationCache)``."""
        ...

    def hooks(self, fwd_hooks: Sequence = (), **kwargs: Any) -> AbstractContextManager:
        """TransformerLens' hook context: the hooks are removed on exit."""
        ...

    def attention_scale(self, layer: int) -> float:
        """The factor on ``q . k`` in layer ``layer``'s attention logits."""
        ...

    def check_forks(self) -> None:
        """A one-line ValueError where the per-head forks cannot carry an edge (a bridge whose
        architecture forks after the norm); nothing where they can (ours)."""
        ...

    def post_norm(self, layer: int, branch: str) -> PostNorm | None:
        """The norm block ``layer`` applies to its ``branch``'s (``"attn"`` or ``"mlp"``) output
        before the residual adds it; None where it adds the output as it is (ours)."""
        ...

    def set_use_split_qkv_input(self, on: bool) -> None:
        """Fire the per-head q/k/v inputs (``attn.hook_q_input`` …), as in TransformerLens."""
        ...

    def set_use_attn_in(self, on: bool) -> None:
        """Fire ``attn.hook_attn_in`` (one per-head input shared by q, k and v)."""
        ...

    def set_use_hook_mlp_in(self, on: bool) -> None:
        """Fire ``hook_mlp_in`` (the MLP's input)."""
        ...


__all__ = [
    "HOOKS",
    "RESTARTS",
    "KVLayout",
    "PositionView",
    "PostNorm",
    "ProbeConfig",
    "ProbeModel",
    "Restart",
    "layer_of",
]

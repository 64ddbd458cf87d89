"""HookedPETransformer: a small hooked transformer classifier with a pluggable positional encoding.

Built on TransformerLens' ``HookedRootModule`` and ``HookPoint`` with its hook names, so
``run_with_cache``, ``run_with_hooks``, ``hooks()`` and ``transformer_lens.patching`` work as they
do on a ``HookedTransformer``::

    tokens ─► W_E ─► hook_embed ─┐
                                 + ─► blocks.{l}: hook_resid_pre ─► ln1 ─► attn ─► hook_attn_out
    encoding.residual() ─► hook_pos_embed ─┘      ─► hook_resid_mid ─► ln2 ─► mlp ─► hook_mlp_out
                                                  ─► hook_resid_post
    ─► ln_final ─► pool over real tokens ─► hook_pooled ─► W_U ─► class logits [batch, n_classes]

Where each encoding enters the attention logit is in :mod:`pe_interp.models.hooked.attention`.

TransformerLens' optional hooks fire when their flag is set (``set_use_attn_result``,
``set_use_split_qkv_input``, ``set_use_attn_in``, ``set_use_hook_mlp_in``), with its semantics:
``attn.hook_result`` is each head's ``z_h W_O[h]`` ``[batch, pos, head, d_model]``;
``attn.hook_q/k/v_input`` (or one shared ``attn.hook_attn_in``) are per-head copies of the
block's input before ``ln1``, normalised per head, so one head's input can be patched alone;
``hook_mlp_in`` is the MLP's input before ``ln2``. With ``kv_source="embed"`` the k and v inputs
are copies of the layer-0 input instead, which every layer's keys and values read.

Seams for probes, so that none of them copies the forward:

- ``forward(..., start_at_layer=l, residual=r)`` resumes from ``blocks.{l}.hook_resid_pre``;
  with ``start_at="resid_mid"`` it resumes from ``blocks.{l}.hook_resid_mid`` (the block's
  MLP half onward);
- :meth:`HookedPETransformer.forward_unchecked` is the same function with the input checks done
  once by the caller (:meth:`check_inputs`): no host syncs, and usable under ``torch.func.vmap``;
- each block is ``attend`` (``resid_pre -> resid_mid``) then ``finish`` (``resid_mid ->
  resid_post``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from pe_interp.config.model import ModelConfig
from pe_interp.encodings import build_encoding
from pe_interp.models.hooked.attention import AttnContext, affine, build_mask
from pe_interp.models.hooked.blocks import Norm, TransformerBlock
from pe_interp.models.protocol import KVLayout, Restart
from pe_interp.util.checks import check_pad_mask_tensor, check_token_ids

START_POINTS = ("resid_pre", "resid_mid")


class HookNameError(ValueError, KeyError):
    """A hook or module name the model does not have (a ``ValueError`` with one line, and a
    ``KeyError`` for code that looks names up in ``mod_dict``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class _ModDict(dict):
    """``HookedRootModule.mod_dict`` whose missing names fail with the nearest hook names."""

    def __missing__(self, name: Any) -> Any:
        import difflib

        hooks = [k for k, m in self.items() if isinstance(m, HookPoint)]
        near = difflib.get_close_matches(str(name), hooks, n=3, cutoff=0.6)
        hint = (
            f"did you mean {', '.join(near)}?"
            if near
            else f"hooks look like {hooks[0]!r}"
            if hooks
            else "no hooks"
        )
        raise HookNameError(
            f"no hook or module named {name!r} in this model; {hint} (model.hook_dict lists every hook)"
        )


class HookedPETransformer(HookedRootModule):
    """A transformer classifier whose positional encoding is a plug-in (``cfg.encoding``).

    ``model(tokens, pad_mask=None)`` returns class logits ``[batch, n_classes]``. ``pad_mask`` is
    True at real tokens; it defaults to ``tokens != cfg.pad_id``. It implements
    :class:`pe_interp.models.protocol.ProbeModel` with every seam (``restart = "resid_mid"``).
    """

    restart: Restart = "resid_mid"  # forward_unchecked restarts at a layer's input or its resid_mid
    can_restart = True
    can_resume = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"HookedPETransformer expects a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.encoding = build_encoding(cfg)
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint()
        extra = self.encoding.extra_qk_dims()
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg, layer, extra) for layer in range(cfg.n_layers)
        )
        self.ln_final = Norm(cfg) if (cfg.normalization_type and cfg.final_norm) else nn.Identity()
        self.hook_pooled = HookPoint()  # [batch, d_model]
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.n_classes))
        self.b_U = nn.Parameter(torch.zeros(cfg.n_classes))
        if cfg.attn_backend == "triton" and self.encoding.fused(0, 1) is None:
            raise ValueError(
                f"ModelConfig.attn_backend='triton': encoding {cfg.encoding_name!r} has no fused form"
            )
        self.init_weights()
        self.setup()
        self.mod_dict = _ModDict(self.mod_dict)
        if cfg.device != "cpu":
            self.to(cfg.device)

    # ---- construction ------------------------------------------------------------------------
    def init_weights(self) -> None:
        """Deterministic initialisation from ``cfg.seed`` (``cfg.init_mode``).

        ``normal``: every ``W_*`` ~ N(0, init_std), biases zero, norm gains one.
        ``torch``: PyTorch's defaults, as the authors' ``nn.Embedding``/``nn.Linear`` get them:
        ``W_E`` ~ N(0, 1), every other ``W_*`` and its bias ~ U(±1/√fan_in) (fan_in: the
        projection's input width), norm gains one and biases zero.
        The encoding initialises its own parameters (reading ``init_mode`` too)."""
        gen = torch.Generator().manual_seed(self.cfg.seed)
        std = self.cfg.init_std
        torch_mode = self.cfg.init_mode == "torch"
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("encoding."):
                    continue
                leaf = name.rsplit(".", 1)[-1]
                if leaf in ("w", "b"):  # a norm's gain and bias
                    p.fill_(1.0 if leaf == "w" else 0.0)
                elif not torch_mode:
                    p.copy_(
                        torch.randn(p.shape, generator=gen) * std
                        if leaf.startswith("W_")
                        else torch.zeros(p.shape)
                    )
                elif leaf == "W_E":
                    p.copy_(torch.randn(p.shape, generator=gen))
                else:
                    bound = 1.0 / math.sqrt(self._fan_in(leaf))
                    p.copy_(torch.rand(p.shape, generator=gen) * (2 * bound) - bound)
        self.encoding.init_parameters(gen, std)
        with torch.no_grad():
            for layer, head in self.cfg.silent_heads:
                attn = self.blocks[layer].attn
                for p in (attn.W_V[head], attn.b_V[head], attn.W_O[head]):
                    p.zero_()

    def _fan_in(self, leaf: str) -> int:
        """Input width of the projection a weight or bias belongs to (``init_mode="torch"``)."""
        cfg = self.cfg
        fan_in = {"O": cfg.n_heads * cfg.d_head, "out": cfg.d_mlp}
        return fan_in.get(leaf.split("_", 1)[1], cfg.d_model)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        device = self.W_E.device
        if str(device) != self.cfg.device:
            self._share_cfg(self.cfg.replace(device=str(device)))
        return out

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- forward -----------------------------------------------------------------------------
    def check_inputs(
        self, tokens: Tensor, pad_mask: Tensor | None
    ) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"] | None]:
        """Validate tokens and return them with the key-validity mask (None: nothing masked)."""
        cfg = self.cfg
        tokens = check_token_ids(tokens, cfg.d_vocab, cfg.n_ctx)
        if not cfg.mask_padding:
            return tokens, None
        pad_mask = check_pad_mask_tensor(tokens, pad_mask, cfg.pad_id)
        return tokens, (None if bool(pad_mask.all()) else pad_mask)

    def embed_input(
        self, tokens: Tensor, fire_hooks: bool = True
    ) -> Float[Tensor, "batch pos d_model"]:
        """Token embedding plus the encoding's residual term: the input of layer 0."""
        embed = F.embedding(tokens, self.W_E)
        pos = self.encoding.residual(tokens.shape[1])
        if fire_hooks:
            embed = self.hook_embed(embed)
        if pos is None:
            return embed
        pos = pos.expand(tokens.shape[0], -1, -1)
        return embed + (self.hook_pos_embed(pos) if fire_hooks else pos)

    def context(
        self, tokens: Tensor, key_valid: Tensor | None, kv_input: Tensor | None
    ) -> AttnContext:
        causal = self.cfg.attention_dir == "causal"
        mask = build_mask(key_valid, tokens.shape[1], causal, self.W_E.dtype, tokens.device)
        return AttnContext(self.encoding, mask, key_valid, causal, kv_input)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        pad_mask: Bool[Tensor, "batch pos"] | None = None,
        *,
        start_at_layer: int = 0,
        stop_at_layer: int | None = None,
        residual: Float[Tensor, "batch pos d_model"] | None = None,
        start_at: str = "resid_pre",
    ) -> Tensor:
        """Class logits ``[batch, n_classes]``.

        ``start_at_layer``/``residual`` resume from a cached ``blocks.{l}.hook_resid_pre``, or
        from ``blocks.{l}.hook_resid_mid`` with ``start_at="resid_mid"``; ``stop_at_layer``
        returns the residual stream before that block instead of logits (as in TransformerLens).
        Embedding hooks fire only when starting at layer 0 from the tokens (no ``residual``).
        """
        tokens, key_valid = self.check_inputs(tokens, pad_mask)
        return self.forward_unchecked(
            tokens,
            key_valid,
            start_at_layer=start_at_layer,
            stop_at_layer=stop_at_layer,
            residual=residual,
            start_at=start_at,
        )

    def forward_unchecked(
        self,
        tokens: Int[Tensor, "batch pos"],
        key_valid: Bool[Tensor, "batch pos"] | None,
        *,
        start_at_layer: int = 0,
        stop_at_layer: int | None = None,
        residual: Tensor | None = None,
        start_at: str = "resid_pre",
    ) -> Tensor:
        """:meth:`forward` without the input checks: ``tokens`` and ``key_valid`` as
        :meth:`check_inputs` returns them (int64 ids; None when every key is real). No host
        syncs, so probes call it in inner loops and under ``torch.func.vmap``."""
        n_layers = self.cfg.n_layers
        stop = n_layers if stop_at_layer is None else stop_at_layer
        if not 0 <= start_at_layer <= stop <= n_layers:
            raise ValueError(f"need 0 <= start_at_layer <= stop_at_layer <= {n_layers}")
        if start_at not in START_POINTS:
            raise ValueError(f"start_at must be one of {', '.join(START_POINTS)}; got {start_at!r}")
        mid = start_at == "resid_mid"
        if start_at_layer == 0 and not mid and residual is None:
            resid = F.dropout(self.embed_input(tokens), self.cfg.embed_dropout_p, self.training)
            kv_input = resid if self.cfg.kv_source == "embed" else None
        else:
            if residual is None:
                raise ValueError(
                    f"start_at_layer={start_at_layer}, start_at={start_at!r} needs residual= (that hook's value)"
                )
            if mid and start_at_layer >= stop:
                raise ValueError("start_at='resid_mid' needs start_at_layer < stop_at_layer")
            resid = residual
            kv_input = (
                self.embed_input(tokens, fire_hooks=False)
                if self.cfg.kv_source == "embed"
                else None
            )
        ctx = self.context(tokens, key_valid, kv_input)
        first = start_at_layer
        if mid:
            resid = self.blocks[first].finish(resid)
            first += 1
        for block in self.blocks[first:stop]:
            resid = block(resid, ctx)
        if stop_at_layer is not None:
            return resid
        return self.readout(resid, key_valid)

    @property
    def kv_layout(self) -> KVLayout:
        """One key/value head per query head."""
        return KVLayout(self.cfg.n_heads, self.cfg.n_heads)

    def resume(
        self,
        tokens: Tensor,
        layer: int,
        residual: Tensor,
        key_valid: Tensor | None,
        fwd_hooks: Sequence = (),
    ) -> Tensor:
        """Class logits of the forward restarted at ``blocks.{layer}.hook_resid_pre`` =
        ``residual`` (``tokens`` and ``key_valid`` as :meth:`check_inputs` returns them), with
        ``fwd_hooks`` (:class:`~pe_interp.models.protocol.ProbeModel`'s resume)."""
        with self.hooks(fwd_hooks=list(fwd_hooks)):
            return self.forward_unchecked(
                tokens, key_valid, start_at_layer=layer, residual=residual
            )

    def pool(
        self, x: Float[Tensor, "batch pos d_model"], key_valid: Tensor | None
    ) -> Float[Tensor, "batch d_model"]:
        how = self.cfg.pooling
        if how == "first":
            return x[:, 0]
        if key_valid is None:
            return x.mean(1) if how == "mean" else x[:, -1]
        if how == "mean":
            w = key_valid.to(x.dtype)
            return (x * w[..., None]).sum(1) / w.sum(1, keepdim=True)
        last = key_valid.shape[1] - 1 - key_valid.flip(1).to(torch.int8).argmax(1)
        return x[torch.arange(x.shape[0], device=x.device), last]

    def readout(self, resid: Tensor, key_valid: Tensor | None) -> Float[Tensor, "batch n_classes"]:
        pooled = self.hook_pooled(self.pool(self.ln_final(resid), key_valid))
        return affine(pooled, self.W_U, self.b_U)

    # ---- TransformerLens conveniences --------------------------------------------------------
    def _share_cfg(self, cfg: ModelConfig) -> None:
        """Give the model and every submodule that reads ``cfg`` the same (new) config."""
        for module in self.modules():
            if isinstance(getattr(module, "cfg", None), ModelConfig):
                module.cfg = cfg

    def _set_flag(self, name: str, value: bool) -> None:
        self._share_cfg(self.cfg.replace(**{name: value}))  # replace() validates

    def attention_scale(self, layer: int) -> float:
        """The factor on ``q . k`` in layer ``layer``: ``1 / sqrt(d_head)`` (plus any extra q/k
        dimensions an encoding appends)."""
        return float(self.blocks[layer].attn.scale)

    def check_forks(self) -> None:
        """Nothing to refuse: every fork of ours carries an edge exactly (each head's q/k/v input
        and ``hook_mlp_in`` fork before the norm that reads them)."""

    def post_norm(self, layer: int, branch: str) -> None:
        """None: each block adds its attention's and its MLP's output to the residual as they are."""

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Fire ``attn.hook_result`` (each head's output ``z_h W_O[h]``), as in TransformerLens."""
        self._set_flag("use_attn_result", use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Fire ``attn.hook_q_input``/``hook_k_input``/``hook_v_input`` (per-head inputs)."""
        self._set_flag("use_split_qkv_input", use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Fire ``attn.hook_attn_in`` (one per-head input shared by q, k and v)."""
        self._set_flag("use_attn_in", use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Fire ``hook_mlp_in`` (the MLP's input before ``ln2``)."""
        self._set_flag("use_hook_mlp_in", use_hook_mlp_in)

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
        """Like TransformerLens: returns ``(logits, ActivationCache)``."""
        out, cache = super().run_with_cache(*args, **kwargs)
        if isinstance(cache, ActivationCache):
            return out, cache
        return out, ActivationCache(
            cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False)
        )

    def extra_repr(self) -> str:
        c = self.cfg
        return (
            f"encoding={c.encoding_name} ({c.encoding_kind}), n_layers={c.n_layers}, d_model={c.d_model}, "
            f"n_heads={c.n_heads}, d_head={c.d_head}, backend={c.attn_backend}"
        )

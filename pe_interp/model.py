"""HookedPETransformer: a small hooked transformer classifier with a pluggable positional encoding.

Built on TransformerLens' ``HookedRootModule`` and ``HookPoint`` with its hook names, so
``run_with_cache``, ``run_with_hooks``, ``hooks()`` and ``transformer_lens.patching`` work as they
do on a ``HookedTransformer``::

    tokens ─► W_E ─► hook_embed ─┐
                                 + ─► blocks.{l}: hook_resid_pre ─► ln1 ─► attn ─► hook_attn_out
    encoding.residual() ─► hook_pos_embed ─┘      ─► hook_resid_mid ─► ln2 ─► mlp ─► hook_mlp_out
                                                  ─► hook_resid_post
    ─► ln_final ─► pool over real tokens ─► hook_pooled ─► W_U ─► class logits [batch, n_classes]

Where each encoding enters the attention logit is in :mod:`pe_interp.attention`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from pe_interp.attention import Attention, AttnContext, build_mask
from pe_interp.config import ModelConfig
from pe_interp.encodings import build_encoding


class Norm(nn.Module):
    """LayerNorm (``LN``) or RMSNorm (``RMS``) with TransformerLens' ``hook_scale`` and
    ``hook_normalized``. Freezing ``hook_scale`` makes the layer linear, which the logit
    decomposition relies on."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.center = cfg.normalization_type == "LN"
        self.eps = cfg.eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model)) if self.center else None
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.center:
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = x / scale * self.w
        return self.hook_normalized(x + self.b if self.b is not None else x)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        return self.hook_post(self.act(pre)) @ self.W_out + self.b_out


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, extra_qk_dims: int = 0):
        super().__init__()
        self.cfg = cfg
        norm = (lambda: Norm(cfg)) if cfg.normalization_type else nn.Identity
        self.ln1 = norm()
        self.attn = Attention(cfg, layer, extra_qk_dims)
        self.ln2 = norm() if cfg.d_mlp else None
        self.mlp = MLP(cfg) if cfg.d_mlp else None
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Tensor, ctx: AttnContext) -> Tensor:
        resid = self.hook_resid_pre(resid)
        x = self.ln1(resid)
        x_kv = x if ctx.kv_input is None else ctx.kv_input
        attn_out = self.hook_attn_out(F.dropout(self.attn(x, x_kv, ctx), self.cfg.dropout, self.training))
        resid = self.hook_resid_mid(resid + attn_out)
        if self.mlp is not None:
            mlp_out = F.dropout(self.mlp(self.ln2(resid)), self.cfg.dropout, self.training)
            resid = resid + self.hook_mlp_out(mlp_out)
        return self.hook_resid_post(resid)


class HookedPETransformer(HookedRootModule):
    """A transformer classifier whose positional encoding is a plug-in (``cfg.encoding``).

    ``model(tokens, pad_mask=None)`` returns class logits ``[batch, n_classes]``. ``pad_mask`` is
    True at real tokens; it defaults to ``tokens != cfg.pad_id``.
    """

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
        self.blocks = nn.ModuleList(TransformerBlock(cfg, layer, extra) for layer in range(cfg.n_layers))
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
        if cfg.device != "cpu":
            self.to(cfg.device)

    # ---- construction ------------------------------------------------------------------------
    def init_weights(self) -> None:
        """Deterministic initialisation from ``cfg.seed``: every ``W_*`` ~ N(0, init_std), biases
        zero, norm gains one; the encoding initialises its own parameters."""
        gen = torch.Generator().manual_seed(self.cfg.seed)
        std = self.cfg.init_std
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("encoding."):
                    continue
                leaf = name.rsplit(".", 1)[-1]
                if leaf.startswith("W_"):
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                elif leaf == "w":
                    p.fill_(1.0)
                else:
                    p.zero_()
        self.encoding.init_parameters(gen, std)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        device = self.W_E.device
        if str(device) != self.cfg.device:
            self.cfg = self.cfg.replace(device=str(device))
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
        if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"tokens must be an integer tensor [batch, pos], got {getattr(tokens, 'dtype', type(tokens))}")
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must have shape [batch, pos] with pos >= 1, got {tuple(tokens.shape)}")
        if tokens.shape[1] > cfg.n_ctx:
            raise ValueError(f"tokens: sequence length {tokens.shape[1]} exceeds n_ctx={cfg.n_ctx}")
        bad = (tokens < 0) | (tokens >= cfg.d_vocab)
        if bad.any():
            where = bad.nonzero()[0].tolist()
            raise ValueError(
                f"tokens: id {tokens[tuple(where)].item()} at {tuple(where)} is outside the "
                f"vocabulary [0, {cfg.d_vocab})"
            )
        tokens = tokens.long()  # int16/uint8 pass the check above, but F.embedding needs int64/int32
        if not cfg.mask_padding:
            return tokens, None
        if pad_mask is None:
            pad_mask = tokens != cfg.pad_id
        elif not isinstance(pad_mask, Tensor) or pad_mask.shape != tokens.shape or pad_mask.dtype != torch.bool:
            raise ValueError(
                f"pad_mask must be a bool tensor shaped like tokens {tuple(tokens.shape)}, "
                f"got {getattr(pad_mask, 'dtype', type(pad_mask).__name__)} {tuple(getattr(pad_mask, 'shape', ()))}"
            )
        if not pad_mask.any(dim=1).all():
            row = (~pad_mask.any(dim=1)).nonzero()[0].item()
            raise ValueError(f"pad_mask: row {row} has no real token")
        return tokens, (None if bool(pad_mask.all()) else pad_mask)

    def embed_input(self, tokens: Tensor, fire_hooks: bool = True) -> Float[Tensor, "batch pos d_model"]:
        """Token embedding plus the encoding's residual term: the input of layer 0."""
        embed = F.embedding(tokens, self.W_E)
        pos = self.encoding.residual(tokens.shape[1])
        if fire_hooks:
            embed = self.hook_embed(embed)
        if pos is None:
            return embed
        pos = pos.expand(tokens.shape[0], -1, -1)
        return embed + (self.hook_pos_embed(pos) if fire_hooks else pos)

    def context(self, tokens: Tensor, key_valid: Tensor | None, kv_input: Tensor | None) -> AttnContext:
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
    ) -> Tensor:
        """Class logits ``[batch, n_classes]``.

        ``start_at_layer``/``residual`` resume from a cached ``blocks.{l}.hook_resid_pre``;
        ``stop_at_layer`` returns the residual stream before that block instead of logits
        (as in TransformerLens). Embedding hooks fire only when starting at layer 0.
        """
        tokens, key_valid = self.check_inputs(tokens, pad_mask)
        n_layers = self.cfg.n_layers
        stop = n_layers if stop_at_layer is None else stop_at_layer
        if not 0 <= start_at_layer <= stop <= n_layers:
            raise ValueError(f"need 0 <= start_at_layer <= stop_at_layer <= {n_layers}")
        if start_at_layer == 0:
            resid = F.dropout(self.embed_input(tokens), self.cfg.dropout, self.training)
            kv_input = resid if self.cfg.kv_source == "embed" else None
        else:
            if residual is None:
                raise ValueError("start_at_layer > 0 needs residual= (that layer's hook_resid_pre)")
            resid = residual
            kv_input = self.embed_input(tokens, fire_hooks=False) if self.cfg.kv_source == "embed" else None
        ctx = self.context(tokens, key_valid, kv_input)
        for block in self.blocks[start_at_layer:stop]:
            resid = block(resid, ctx)
        if stop_at_layer is not None:
            return resid
        return self.readout(resid, key_valid)

    def pool(self, x: Float[Tensor, "batch pos d_model"], key_valid: Tensor | None) -> Float[Tensor, "batch d_model"]:
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
        return pooled @ self.W_U + self.b_U

    # ---- TransformerLens conveniences --------------------------------------------------------
    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
        """Like TransformerLens: returns ``(logits, ActivationCache)``."""
        out, cache = super().run_with_cache(*args, **kwargs)
        if isinstance(cache, ActivationCache):
            return out, cache
        return out, ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def extra_repr(self) -> str:
        c = self.cfg
        return (
            f"encoding={c.encoding_name} ({c.encoding_kind}), n_layers={c.n_layers}, d_model={c.d_model}, "
            f"n_heads={c.n_heads}, d_head={c.d_head}, backend={c.attn_backend}"
        )

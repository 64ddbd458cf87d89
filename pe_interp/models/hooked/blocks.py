"""The transformer's parts below the model: norms, the MLP, and a block (``attend`` then
``finish``), in TransformerLens' hook vocabulary. :mod:`pe_interp.models.hooked.model` stacks them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from pe_interp.config.model import ModelConfig
from pe_interp.models.hooked.attention import Attention, AttnContext, affine, has_hooks

__all__ = ["MLP", "Norm", "TransformerBlock"]


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
        # The fused kernel computes the output; the scale is materialised only for a hook on it,
        # and used only if that hook replaced it (e.g. frozen for a linear decomposition). So a
        # cached or hooked forward gives the same numbers as a plain one.
        shape = (x.shape[-1],)
        if self.center:
            out = F.layer_norm(x, shape, self.w, self.b, self.eps)
        else:
            out = F.rms_norm(x, shape, self.w, self.eps)
        if has_hooks(self.hook_scale):
            centred = x - x.mean(-1, keepdim=True) if self.center else x
            scale = (centred.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
            given = self.hook_scale(scale)
            if given is not scale:
                out = centred / given * self.w
                out = out + self.b if self.b is not None else out
        return self.hook_normalized(out)


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
        pre = self.hook_pre(affine(x, self.W_in, self.b_in))
        return affine(self.hook_post(self.act(pre)), self.W_out, self.b_out)


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
        self.hook_mlp_in = HookPoint()  # fires when cfg.use_hook_mlp_in
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Tensor, ctx: AttnContext) -> Tensor:
        return self.finish(self.attend(resid, ctx))

    def attention_inputs(self, resid: Tensor, ctx: AttnContext) -> tuple[Tensor, Tensor, Tensor]:
        """The normalised q, k and v inputs of this block's attention, ``[batch, pos, d_model]``,
        or ``[batch, pos, head, d_model]`` when a per-head fork (``use_split_qkv_input`` /
        ``use_attn_in``) is on."""
        cfg, attn = self.cfg, self.attn
        kv = ctx.kv_input  # kv_source="embed": the layer-0 input, not normalised
        if not (cfg.use_split_qkv_input or cfg.use_attn_in):
            x = self.ln1(resid)
            return (x, x, x) if kv is None else (x, kv, kv)

        def per_head(x: Tensor) -> Tensor:
            return x[:, :, None, :].expand(-1, -1, cfg.n_heads, -1).clone()

        if cfg.use_attn_in:
            x = self.ln1(attn.hook_attn_in(per_head(resid)))
            return x, x, x
        q = self.ln1(attn.hook_q_input(per_head(resid)))
        if kv is None:
            return (
                q,
                self.ln1(attn.hook_k_input(per_head(resid))),
                self.ln1(attn.hook_v_input(per_head(resid))),
            )
        return q, attn.hook_k_input(per_head(kv)), attn.hook_v_input(per_head(kv))

    def attend(self, resid: Tensor, ctx: AttnContext) -> Tensor:
        """``resid_pre -> resid_mid`` (before ``hook_resid_mid``, which :meth:`finish` fires)."""
        resid = self.hook_resid_pre(resid)
        attn_out = self.attn(*self.attention_inputs(resid, ctx), ctx)
        return resid + self.hook_attn_out(F.dropout(attn_out, self.cfg.dropout, self.training))

    def finish(self, resid: Tensor) -> Tensor:
        """``resid_mid -> resid_post``: ``hook_resid_mid``, then the MLP half."""
        resid = self.hook_resid_mid(resid)
        if self.mlp is not None:
            x = self.hook_mlp_in(resid.clone()) if self.cfg.use_hook_mlp_in else resid
            mlp_out = F.dropout(self.mlp(self.ln2(x)), self.cfg.dropout, self.training)
            resid = resid + self.hook_mlp_out(mlp_out)
        return self.hook_resid_post(resid)

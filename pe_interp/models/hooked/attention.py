"""Multi-head attention, and the one place where every positional encoding enters the logit.

For a head h in layer l, with ``enc`` the model's encoding::

    q, k, v = x_q W_Q + b_Q,  x_k W_K + b_K,  x_v W_V + b_V         hook_q, hook_k, hook_v
    q, k    = enc.extend(x_q, x_k, q, k)      decoupled RoPE appends a sub-space
    q, k    = enc.rotate(q, k)                multiplicative: RoPE        hook_rot_q, hook_rot_k
    logits  = (q . k) / sqrt(d_qk)
            + enc.bias()                      additive: T5, ALiBi          hook_pos_bias
            + mask                            causal, padding: -inf        hook_attn_scores
    pattern = softmax(logits)                                              hook_pattern
    z       = pattern v                                                    hook_z
    out     = sum_h z_h W_O[h] + b_O                                      (hook_result per head)

Absolute encodings (sinusoidal, learned) act earlier, on the residual stream (``hook_pos_embed``
in :mod:`pe_interp.models.hooked.model`).

Three backends compute the same function:

- ``eager`` materialises scores and pattern and fires every hook; it is the reference.
- ``sdpa`` calls ``F.scaled_dot_product_attention`` with the bias and mask as one float
  ``attn_mask`` (trains on CPU, gradient into a learned bias included). Under CPU bf16
  autocast it takes the fastest of SDPA, SDPA in fp32 and the eager math for the shape,
  measured once (:mod:`pe_interp.models.hooked.attn_routes`).
- ``triton`` runs the fused kernel of :mod:`pe_interp.kernels`, with rotation and bias inside.

A layer whose ``hook_attn_scores`` or ``hook_pattern`` has a hook (including caching) always runs
eagerly, whatever the backend, so hooks never silently miss. The fused kernel also steps aside
for the SDPA path when ``hook_rot_q/k`` or ``hook_pos_bias`` are hooked. ``auto`` picks triton
on CUDA when the encoding can be fused and no attention dropout is active, SDPA otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from pe_interp.config.model import ModelConfig
from pe_interp.encodings import Encoding
from pe_interp.models.hooked import attn_routes


@dataclass(frozen=True)
class AttnContext:
    """Per-forward state shared by every layer (built once by the model)."""

    encoding: Encoding
    mask: Float[Tensor, "batch_or_1 1 q_pos k_pos"] | None  # 0 where allowed, -inf elsewhere
    key_valid: Bool[Tensor, "batch pos"] | None  # None: every key is real
    causal: bool
    kv_input: Float[Tensor, "batch pos d_model"] | None = None  # kv_source="embed"


def build_mask(
    key_valid: Bool[Tensor, "batch pos"] | None, n_pos: int, causal: bool, dtype, device
) -> Tensor | None:
    """Additive mask: key j is visible to query i iff it is a real token (or i == j, so that no
    row is ever empty) and, when causal, j <= i."""
    if key_valid is None and not causal:
        return None
    allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None]
    if key_valid is not None:
        eye = torch.eye(n_pos, dtype=torch.bool, device=device)
        allowed = allowed & (key_valid[:, None, None, :] | eye)
    zeros = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return zeros.masked_fill(~allowed, float("-inf"))


def affine(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """``x @ W + b`` (``W``: ``[in, out]``). Under autocast it is one ``F.linear``, so the output
    stays in the autocast dtype (a separate fp32 bias add would promote it back to fp32 and cast
    again at the next matmul); in fp32 the plain form, whose numbers the tests pin."""
    if torch.is_autocast_enabled(x.device.type):
        return F.linear(x, W.T, b)
    return x @ W + b


def _cpu_bf16_autocast(x: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
    )


def _cast_once(dtype: torch.dtype, *xs: Tensor) -> list[Tensor]:
    """``xs`` in ``dtype``, casting each distinct tensor once (autocast would cast a shared input
    once per projection that reads it)."""
    done: dict[int, Tensor] = {}
    for x in xs:
        if id(x) not in done:
            done[id(x)] = x.to(dtype)
    return [done[id(x)] for x in xs]


def has_hooks(*points: HookPoint) -> bool:
    # TransformerLens' add_hook registers plain torch hooks too; look at those, so no hook is missed.
    return any(
        p.fwd_hooks or p.bwd_hooks or p._forward_hooks or p._forward_pre_hooks or p._backward_hooks
        for p in points
    )


class Attention(nn.Module):
    """Multi-head attention in TransformerLens' weight layout (``W_Q: [head, d_model, d_head]``)."""

    def __init__(self, cfg: ModelConfig, layer: int, extra_qk_dims: int = 0):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        H, M, D = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(H, M, D))
        self.W_K = nn.Parameter(torch.empty(H, M, D))
        self.W_V = nn.Parameter(torch.empty(H, M, D))
        self.W_O = nn.Parameter(torch.empty(H, D, M))
        self.b_Q = nn.Parameter(torch.zeros(H, D))
        self.b_K = nn.Parameter(torch.zeros(H, D))
        self.b_V = nn.Parameter(torch.zeros(H, D))
        self.b_O = nn.Parameter(torch.zeros(M))
        self.scale = 1.0 / math.sqrt(D + extra_qk_dims)

        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_rot_q = HookPoint()  # after the encoding's rotation (and extension)
        self.hook_rot_k = HookPoint()
        self.hook_pos_bias = HookPoint()  # [head, q_pos, k_pos]
        self.hook_attn_scores = HookPoint()  # [batch, head, q_pos, k_pos]
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        # TransformerLens' optional hooks (see pe_interp.models.hooked.model): [batch, pos, head, d_model]
        self.hook_q_input = HookPoint()
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        self.hook_attn_in = HookPoint()
        self.hook_result = HookPoint()
        for hp in (self.hook_attn_scores, self.hook_pattern):
            hp.pos_dim = -2

    @staticmethod
    def _project(x: Tensor, W: Tensor, b: Tensor) -> Float[Tensor, "batch pos head d"]:
        """``x`` is ``[batch, pos, d_model]``, or ``[batch, pos, head, d_model]`` (a per-head
        input: each head projects its own copy)."""
        if x.ndim == 4:
            return torch.einsum("bphm,hmd->bphd", x, W) + b
        H, M, D = W.shape
        if torch.is_autocast_enabled(x.device.type):
            out = affine(x, W.permute(1, 0, 2).reshape(M, H * D), b.reshape(H * D))
            return out.view(*x.shape[:-1], H, D)
        out = x @ W.permute(1, 0, 2).reshape(M, H * D)
        return out.view(*x.shape[:-1], H, D) + b

    def backend(self, ctx: AttnContext) -> str:
        """Which backend this layer uses for this forward (see the module docstring)."""
        if self.cfg.attn_backend == "eager" or has_hooks(self.hook_attn_scores, self.hook_pattern):
            return "eager"
        dropout_on = self.training and self.cfg.attn_dropout > 0
        pe_hooked = has_hooks(self.hook_rot_q, self.hook_rot_k, self.hook_pos_bias)
        if self.cfg.attn_backend == "triton":
            return "sdpa" if pe_hooked else "triton"
        if (
            self.cfg.attn_backend == "auto"
            and self.W_Q.is_cuda
            and not dropout_on
            and not pe_hooked
        ):
            from pe_interp.kernels import triton_available

            if triton_available() and ctx.encoding.fused(self.layer, 1) is not None:
                return "triton"
        return "sdpa"

    def forward(
        self,
        x_q: Float[Tensor, "batch pos d_model"],
        x_k: Float[Tensor, "batch pos d_model"],
        x_v: Float[Tensor, "batch pos d_model"],
        ctx: AttnContext,
    ) -> Float[Tensor, "batch pos d_model"]:
        """Inputs are ``[batch, pos, d_model]`` or per-head ``[batch, pos, head, d_model]``."""
        enc, layer = ctx.encoding, self.layer
        if torch.is_autocast_enabled(x_q.device.type):  # one cast of an input that q, k, v share
            x_q, x_k, x_v = _cast_once(torch.get_autocast_dtype(x_q.device.type), x_q, x_k, x_v)
        q = self.hook_q(self._project(x_q, self.W_Q, self.b_Q))
        k = self.hook_k(self._project(x_k, self.W_K, self.b_K))
        v = self.hook_v(self._project(x_v, self.W_V, self.b_V))
        q, k = enc.extend(x_q, x_k, q, k, layer)

        backend = self.backend(ctx)
        if backend == "triton":
            z = self._fused(q, k, v, ctx)
        else:
            if enc.rotates:  # multiplicative: position rotates q and k
                q, k = enc.rotate(q, k, layer)
                q, k = self.hook_rot_q(q), self.hook_rot_k(k)
            bias = enc.bias(q.shape[1], k.shape[1], layer)  # additive: a [head, q, k] term
            if bias is not None:
                bias = self.hook_pos_bias(bias)
            run = self._eager if backend == "eager" else self._sdpa
            if backend == "sdpa" and _cpu_bf16_autocast(q):
                run = self._routed(q, k, v, bias, ctx.mask)
            z = run(q, k, v, bias, ctx.mask)
        z = self.hook_z(z)
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(2) + self.b_O
        if torch.is_autocast_enabled(z.device.type):
            return affine(
                z.reshape(*z.shape[:2], -1), self.W_O.reshape(-1, self.W_O.shape[-1]), self.b_O
            )
        return torch.einsum("bphd,hdm->bpm", z, self.W_O) + self.b_O

    def _eager(self, q, k, v, bias, mask) -> Tensor:
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        if bias is not None:
            scores = scores + bias
        if mask is not None:
            scores = scores + mask
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        pattern = F.dropout(pattern, self.cfg.attn_dropout, self.training)
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

    def _sdpa(self, q, k, v, bias, mask) -> Tensor:
        attn_mask = bias[None] if bias is not None else None
        if mask is not None:
            attn_mask = mask if attn_mask is None else attn_mask + mask
        if attn_mask is not None:
            attn_mask = attn_mask.to(q.dtype)
        z = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attn_mask,
            dropout_p=self.cfg.attn_dropout if self.training else 0.0,
            scale=self.scale,
        )
        return z.transpose(1, 2)

    def _sdpa32(self, q, k, v, bias, mask) -> Tensor:
        """SDPA on fp32 copies of bf16 inputs (see :mod:`pe_interp.models.hooked.attn_routes`)."""
        with torch.autocast("cpu", enabled=False):
            z = self._sdpa(
                q.float(), k.float(), v.float(), None if bias is None else bias.float(), mask
            )
        return z.to(q.dtype)

    def _routed(self, q, k, v, bias, mask):
        """The fastest of the eager, SDPA and fp32-SDPA paths for this shape under CPU bf16
        autocast, chosen once per shape by :func:`pe_interp.models.hooked.attn_routes.choose`."""
        runs = {"math": self._eager, "sdpa": self._sdpa, "sdpa32": self._sdpa32}
        shapes = [
            tuple(m.shape) for m in (None if bias is None else bias[None], mask) if m is not None
        ]
        key = attn_routes.RouteKey(
            device=q.device.type,
            dtype=str(q.dtype).removeprefix("torch."),
            q_shape=tuple(q.shape),
            v_shape=tuple(v.shape),
            mask_shape=tuple(torch.broadcast_shapes(*shapes)) if shapes else None,
            dropout=self.training and self.cfg.attn_dropout > 0,
            grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
        )
        fixed = (
            None if bias is None else bias.detach(),
            mask,
        )  # the measurement must not touch real grads
        route = attn_routes.choose(key, lambda r, q_, k_, v_: runs[r](q_, k_, v_, *fixed), q, k, v)
        return runs[route]

    def _fused(self, q, k, v, ctx: AttnContext) -> Tensor:
        from pe_interp.kernels import fused_attention

        pe = ctx.encoding.fused(self.layer, q.shape[1])
        if pe is None:
            raise ValueError(
                f"attn_backend='triton': encoding {self.cfg.encoding_name!r} cannot be fused "
                "(it defines rotate/bias without a fused() description); use 'auto' or 'sdpa'"
            )
        z = fused_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            scale=self.scale,
            causal=ctx.causal,
            key_valid=ctx.key_valid,
            rope=pe.rope,
            alibi_slopes=pe.alibi_slopes,
            rel_bias=pe.rel_bias,
        )
        return z.transpose(1, 2)

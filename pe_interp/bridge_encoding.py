"""The positions of a TransformerLens bridge, as the probes read an encoding
(:class:`BridgeEncoding`; :class:`pe_interp.bridge.BridgedModel.encoding`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from pe_interp.encodings.base import RotarySpan

__all__ = ["BridgeEncoding"]


class BridgeEncoding:
    """The positions a probe can read and move on a bridge, as :func:`probes.route_shares` and the
    logit decomposition read an encoding: the rotary q/k of Llama and GPT-NeoX
    (:meth:`rotary_spans`, Hugging Face's ``rotate_half`` pairs, read from the bridge's own
    ``hook_cos``/``hook_sin``; moved at ``hook_q``/``hook_k``, before the bridge rotates: rotations
    of one pair commute, so the moved head is rotated to the new position exactly;
    :meth:`rotate` rotates them as the bridge does), GPT-2's learned positions (the residual
    route, ``hook_pos_embed``) and BLOOM's ALiBi (a head's bias ``slope_h * j`` moved inside the
    attention scores, ``hook_attn_scores``: :meth:`move_bias`). The logit decomposition needs the
    bias as a term of its own, which BLOOM's bridge does not hook: it says so in one line."""

    rotation_hooks = ("hook_q", "hook_k")
    unrotated_hooks = (
        "hook_q",
        "hook_k",
    )  # q/k before the rotation (the logit decomposition's direct term)

    def __init__(self, model: Any) -> None:  # a pe_interp.bridge.BridgedModel
        self.model = model
        c = model.cfg
        hf = model.bridge.original_model.config
        n_kv = getattr(hf, "num_key_value_heads", None) or c.n_heads
        self.why_not = None  # why no probe can read this architecture's positions
        self.cannot_move = None  # why route shares cannot move one head's positions (the decomposition can read them)
        if c.model_type not in ("llama", "gpt_neox", "gpt2", "bloom"):
            self.why_not = (
                f"{c.encoding_name}: the bridge has no hook that moves one head's positions, which route "
                "shares need; ablation, patching, attribution and circuits run on it"
            )
            self.cannot_move = self.why_not
        elif n_kv != c.n_heads:
            self.cannot_move = (
                f"{c.encoding_name}: {n_kv} key/value heads for {c.n_heads} query heads; route shares "
                "move each head's queries and keys together (the logit decomposition, ablation, "
                "patching, attribution and circuits run on it)"
            )
        self._spans: dict[int, tuple[RotarySpan, ...]] = {}

    @property
    def rotates(self) -> bool:
        if self.why_not is not None:
            raise ValueError(self.why_not)
        return self.model.cfg.model_type in ("llama", "gpt_neox")

    @property
    def has_bias(self) -> bool:
        return self.model.cfg.model_type == "bloom"

    @cached_property
    def slopes(self) -> Tensor:
        """BLOOM's ALiBi slope of each head ``[n_heads]``, from Hugging Face's own table."""
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor

        ones = torch.ones(1, 2, dtype=torch.long, device=self.model.W_E.device)
        return build_alibi_tensor(ones, self.model.cfg.n_heads, torch.float32)[:, 0, 1]

    def rotary_spans(self, layer: int) -> tuple[RotarySpan, ...] | None:
        if not self.rotates:
            return None
        if layer not in self._spans:
            c, seen = self.model.cfg, {}
            hooks = [
                (
                    f"blocks.{layer}.attn.hook_{n}",
                    lambda x, hook, n=n: seen.__setitem__(n, x.detach()[0]),
                )
                for n in ("cos", "sin")
            ]
            with torch.no_grad():
                self.model.bridge.run_with_hooks(
                    torch.zeros(1, c.n_ctx, dtype=torch.long, device=self.model.W_E.device),
                    fwd_hooks=hooks,
                )
            cos, sin = (
                seen["cos"],
                seen["sin"],
            )  # [n_ctx, rotary dim], each angle twice (rotate_half)
            half = cos.shape[-1] // 2
            theta = torch.atan2(sin[1, :half], cos[1, :half]).double()
            self._spans[layer] = (
                RotarySpan(0, 2 * half, theta, cos[:, :half], sin[:, :half], halves=True),
            )
        return self._spans[layer]

    @property
    def decomposes(self) -> bool:
        """Whether the logit decomposition reads every term of this architecture's logits."""
        return self.why_not is None and not self.has_bias

    def rotate(self, q: Tensor, k: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """``q``, ``k`` ``[batch, pos, head, d_head]`` (``hook_q``/``hook_k``) rotated at positions
        ``0..pos-1``, as the bridge rotates them (identity for GPT-2)."""
        spans = self.rotary_spans(layer) or ()

        def turn(t: Tensor) -> Tensor:
            out, n = t.clone(), t.shape[1]
            for s in spans:
                c, sn = (
                    s.cos[:n, None, :].to(t.dtype),
                    s.sin[:n, None, :].to(t.dtype),
                )  # [pos, 1, half]
                out[..., s.start : s.start + s.dim] = s.turn(t, c, sn)
            return out

        return turn(q), turn(k)

    def bias(self, n_q: int, n_k: int, layer: int) -> Tensor | None:
        """BLOOM's ALiBi term ``[head, q, k]``: ``slope_h * j``, a key's position times the head's
        slope (Hugging Face's form; ``slope_h * (j - i)`` differs by a constant per query row, which
        the softmax ignores). None for the other architectures."""
        if not self.has_bias:
            return None
        j = torch.arange(n_k, dtype=torch.float32, device=self.slopes.device)
        return (self.slopes[:, None, None] * j[None, None, :]).expand(-1, n_q, -1)

    def move_bias(self, layer: int, sigma: Tensor, heads: Tensor) -> Callable:
        """A ``hook_attn_scores`` hook ``[B, head, q, k]`` that lets the heads ``heads [B, head]``
        see the positions ``sigma [B, pos]``: ``slope_h * (σ(j) - j)`` added at every entry the
        mask allows (the causal mask itself stays at the true positions, as in our models)."""
        shift = (sigma - torch.arange(sigma.shape[1], device=sigma.device)[None]).to(
            torch.float32
        )  # [B, k]

        def hook(scores: Tensor, hook: Any) -> Tensor:
            add = (
                self.slopes.to(scores.dtype)[None, :, None, None]
                * shift.to(scores.dtype)[:, None, None, :]
            )
            keep = heads[:, :, None, None] & (scores > torch.finfo(scores.dtype).min / 2)
            return torch.where(keep, scores + add, scores)

        return hook

    def residual(self, n: int) -> Tensor | None:
        """GPT-2's learned position vectors ``[n, d_model]`` (None for the others)."""
        return self.model.bridge.W_pos[:n] if self.model.cfg.model_type == "gpt2" else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends ask for these
            raise AttributeError(name)
        raise ValueError(self.not_ours())

    def not_ours(self) -> str:
        """Why the logit decomposition cannot split this bridge's logits (one line)."""
        if self.why_not is None and self.has_bias:
            return (
                f"{self.model.cfg.encoding_name}: the bridge adds the ALiBi bias inside the attention scores, with "
                "no hook of its own, so the logit decomposition cannot show it as a term (route shares, "
                "positional_scores' template and Toeplitz scores, ablation, patching and attribution run on it)"
            )
        return self.why_not or f"{self.model.cfg.encoding_name}: not decomposable"

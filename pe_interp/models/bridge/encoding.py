"""The positions of a TransformerLens bridge, as the probes read an encoding
(:class:`BridgeEncoding`; :class:`pe_interp.models.bridge.model.BridgedModel.encoding`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from pe_interp.encodings.base import HeadAxes, RotarySpan
from pe_interp.models.bridge.alibi import alibi_slopes
from pe_interp.models.bridge.check import ForwardCheck

__all__ = ["BridgeEncoding"]


class BridgeEncoding(ForwardCheck):
    """The positions a probe can read and move on a bridge, as :func:`probes.route_shares` and the
    logit decomposition read an encoding (:class:`pe_interp.models.protocol.PositionView`), read
    from the bridge's components, hooks and config, never from a table of model names (issue 47):

    - **rotary** (a rotary module, ``rotary_emb``, or every layer's ``hook_cos``/``hook_sin``):
      :meth:`rotary_spans`, Hugging Face's ``rotate_half`` pairs over the rotated share of each
      head (partial rotary too), their tables computed by the model's own rotary module at the
      length a probe asks, never at the whole context, per layer where the config gives each layer
      type its own RoPE (Gemma 3's local and global bases). Route shares move a head at
      ``hook_q``/``hook_k`` before the bridge rotates (rotations of one pair commute, so the moved
      head is rotated to the new position exactly; with grouped key/value heads ``hook_k`` carries
      the shared keys, which :mod:`probes.routes.moving` moves for one query head of a group at a
      time), or at ``hook_rot_q``/``hook_rot_k`` where a QK-norm sits between ``hook_q`` and the
      rotation (:attr:`rotation_hooks`);
    - **learned** positions (a ``pos_embed`` component, GPT-2's): the residual route;
    - **ALiBi** (BLOOM's, MPT's, Falcon's: the slopes read from the bridge's scores,
      :mod:`pe_interp.models.bridge.alibi`): a head's bias ``slope_h * j`` moved inside the attention
      scores (``hook_attn_scores``: :meth:`move_bias`). The logit decomposition needs the bias as
      a term of its own, which these bridges do not hook: it says so in one line.

    Before route shares or the decomposition read a rotary bridge, one forward of a few tokens
    (:meth:`_check`) shows that these tables reproduce the bridge's rotated q/k in every layer
    (its ``hook_rot_q``/``hook_rot_k``, or its scores where it hooks no rotated q/k) and that
    ``hook_attn_scores`` is ``scale * rot(q) . rot(k)``; where either fails, or the config names
    what no sum of terms can show (attention-logit soft-capping), or the tables carry a YaRN or
    LongRoPE scale, the probe that needs it refuses in one line that names what it lacks."""

    sized_spans = True  # rotary_spans(layer, n_pos): tables computed at the length asked
    check_length = 7  # tokens in the one forward that checks the rotation against the bridge's

    def __init__(self, model: Any) -> None:  # a pe_interp.models.bridge.model.BridgedModel
        self.model = model
        c, bridge = model.cfg, model.bridge
        self._spans: dict[int, tuple[RotarySpan, ...]] = {}
        self._tables: dict[tuple[Any, Any], tuple[Tensor, Tensor]] = {}  # per rotary config
        self._rotary, self._learned, self._alibi = position_sources(bridge)
        self.why_not = None  # why no probe can read this architecture's positions
        if not (self._rotary or self._learned or self._alibi):
            self.why_not = (
                f"{c.encoding_name}: the bridge has no rotary module (rotary_emb, hook_cos/hook_sin), "
                "learned position table (pos_embed) or ALiBi bias in its scores, so no probe can read where its "
                "positions enter; ablation, patching, attribution and circuits run on it"
            )
        self._checked: dict[str, Any] | None = None  # what one forward showed (_check)

    # ------------------------------------------------------------------ checked against a forward
    @property
    def cannot_move(self) -> str | None:
        """Why route shares cannot move one head's positions (None: they can): no positions found,
        or rotation tables that do not reproduce the bridge's rotated q/k (:meth:`_check`)."""
        if self.why_not is not None:
            return self.why_not
        return self._check()["tables"] if self._rotary else None

    @property
    def rotation_hooks(self) -> tuple[str, str]:
        """Where route shares move a head's rotation: ``hook_q``/``hook_k`` where the bridge rotates
        them as they are (q ``[b, pos, n_heads, d]``, k ``[b, pos, n_kv_heads, d]``: one pair's
        rotations commute, so the moved head is rotated to the new position exactly); else, where
        something sits between them and the rotation (a QK-norm), the rotated ``hook_rot_q``/
        ``hook_rot_k``, turned by the angle between the true and the new position."""
        return self._check()["rotation_hooks"]

    @property
    def unrotated_hooks(self) -> tuple[str, str] | None:
        """The hooks holding q/k right before the rotation (the decomposition's direct term), or
        None where they are not hooked as such (behind a QK-norm: the rotation is undone with the
        tables instead)."""
        return self._check()["unrotated_hooks"]

    # ------------------------------------------------------------------ the encoding's reads
    @property
    def rotates(self) -> bool:
        if self.why_not is not None:
            raise ValueError(self.why_not)
        return self._rotary

    @property
    def has_bias(self) -> bool:
        return self._alibi

    @cached_property
    def slopes(self) -> Tensor:
        """Each head's ALiBi slope ``[n_heads]``, in the units of the attention scores, read from
        the bridge's own forward (:func:`pe_interp.models.bridge.alibi.alibi_slopes`)."""
        slopes = alibi_slopes(self.model.bridge)
        if slopes is None:
            raise ValueError(f"{self.model.cfg.encoding_name}: the bridge adds no ALiBi bias")
        return slopes.to(self.model.W_E.device)

    def rotary_spans(self, layer: int, n_pos: int | None = None) -> tuple[RotarySpan, ...] | None:
        """The rotated span of ``layer`` (Hugging Face's ``rotate_half`` pairs), its cos/sin
        tables covering at least ``n_pos`` positions (None: the model's context, ``n_ctx``).
        The tables come from the model's own rotary module, called on ``position_ids``
        ``0..n-1`` as the model calls it (its rope scaling included; the layer's ``layer_type``
        where the config gives each layer its own RoPE), once per distinct module and layer
        type, and grown when a longer length is asked (:attr:`sized_spans`)."""
        if not self.rotates:
            return None
        n = max(2, self.model.cfg.n_ctx if n_pos is None else int(n_pos))  # theta reads row 1
        if layer not in self._spans or self._spans[layer][0].cos.shape[0] < n:
            key = self._rope_key(layer)
            if key not in self._tables or self._tables[key][0].shape[0] < n:
                self._compute(key, n)
            cos, sin = self._tables[key]  # [n, rotary dim], each angle twice (rotate_half)
            # YaRN's or LongRoPE's attention scaling folded into the tables: the module's own
            # factor, else the tables' norm beyond their dtype's rounding
            scaling = _attention_scaling(*key)
            norm = float((cos.double() ** 2 + sin.double() ** 2 - 1).abs().max())
            if abs(scaling - 1.0) > 1e-6 or norm > max(1e-3, 8 * torch.finfo(cos.dtype).eps):
                raise ValueError(
                    f"{self.model.cfg.encoding_name}: the rotary module's cos/sin tables carry a "
                    f"scale (attention scaling {scaling:.4g}, cos^2 + sin^2 - 1 up to {norm:.2g}: "
                    "YaRN or LongRoPE), which route shares' moved rotations and the per-frequency "
                    "terms do not undo"
                )
            half = cos.shape[-1] // 2
            theta = torch.atan2(sin[1, :half], cos[1, :half]).double()
            self._spans[layer] = (
                RotarySpan(0, 2 * half, theta, cos[:, :half], sin[:, :half], halves=True),
            )
        return self._spans[layer]

    def _rope_key(self, layer: int) -> tuple[Any, Any]:
        """``(rotary module, layer type)`` of ``layer``: the layer's own rotary module where its
        attention has one, else the model's (``rotary_emb``); the config's ``layer_types[layer]``
        where that module's forward takes a ``layer_type``. ``(None, layer)`` where no module is
        found (the tables are then read from the bridge's ``hook_cos``/``hook_sin``)."""
        attn = self.model.bridge.blocks[layer].attn
        mod = getattr(getattr(attn, "original_component", None), "rotary_emb", None)
        for other in (getattr(attn, "_rotary_emb", None), self._model_rotary):
            mod = other if mod is None else mod
        if mod is None:
            return None, layer
        inner = getattr(mod, "original_component", None)  # the bridge's wrapper: its HF module
        mod = mod if inner is None else inner
        types = getattr(self.model.bridge.original_model.config, "layer_types", None)
        takes = "layer_type" in inspect.signature(mod.forward).parameters
        return mod, (types[layer] if takes and types else None)

    @cached_property
    def _model_rotary(self) -> Any:
        return model_rotary(self.model.bridge)

    def _compute(self, key: tuple[Any, Any], n: int) -> None:
        """The cos/sin tables ``[n, rotary dim]`` of ``key`` (:meth:`_rope_key`) at ``n``
        positions, into the cache (every layer's at once where they come from a forward)."""
        mod, layer_type = key
        if mod is None:
            self._tables.update(self._hooked_tables(n))
            return
        dev, dtype = self.model.W_E.device, self.model.W_E.dtype
        pos = torch.arange(n, device=dev)[None]
        x = torch.zeros(1, n, 1, device=dev, dtype=dtype)  # gives the dtype, as hidden_states does
        with torch.no_grad():
            out = mod(x, pos) if layer_type is None else mod(x, pos, layer_type)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError(
                f"{self.model.cfg.encoding_name}: the rotary module {type(mod).__name__} returns "
                "no (cos, sin) pair; route shares and the logit decomposition read those tables"
            )
        self._tables[key] = (out[0].detach()[0], out[1].detach()[0])

    def _hooked_tables(self, n: int) -> dict:
        """Every layer's tables from one forward of ``n`` tokens (``hook_cos``/``hook_sin``):
        where no rotary module is found."""
        c, seen = self.model.cfg, {}
        names = [f"blocks.{i}.attn.hook_{t}" for i in range(c.n_layers) for t in ("cos", "sin")]
        if any(name not in self.model.bridge.hook_dict for name in names):
            raise ValueError(
                f"{c.encoding_name}: the bridge exposes neither a rotary module (rotary_emb) nor "
                "every layer's hook_cos/hook_sin, so its rotation tables cannot be read; route "
                "shares and the logit decomposition need them"
            )
        hooks = [
            (name, lambda x, hook: seen.__setitem__(hook.name, x.detach()[0])) for name in names
        ]
        with torch.no_grad():
            self.model.bridge.run_with_hooks(
                torch.zeros(1, n, dtype=torch.long, device=self.model.W_E.device), fwd_hooks=hooks
            )
        return {
            (None, i): (seen[f"blocks.{i}.attn.hook_cos"], seen[f"blocks.{i}.attn.hook_sin"])
            for i in range(c.n_layers)
        }

    @property
    def decomposes(self) -> bool:
        """Whether the logit decomposition reads every term of this architecture's logits: its
        positions found, not BLOOM's unhooked ALiBi, and one forward showing that this encoding
        reproduces the bridge's rotated q/k and that ``hook_attn_scores`` is their scaled
        product (:meth:`_check`)."""
        if self.why_not is not None or self.has_bias:
            return False
        checked = self._check()
        return checked["tables"] is None and checked["scores"] is None

    def rotate(self, q: Tensor, k: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """``q``, ``k`` ``[batch, pos, head, d_head]`` (``hook_q``/``hook_k``) rotated at positions
        ``0..pos-1``, as the bridge rotates them (identity for GPT-2)."""
        return self._turn(q, k, self.rotary_spans(layer, q.shape[1]) or ())

    @staticmethod
    def _turn(q: Tensor, k: Tensor, spans: Any) -> tuple[Tensor, Tensor]:
        """``q``, ``k`` rotated by ``spans`` at positions ``0..pos-1``."""

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
        """The ALiBi term ``[head, q, k]``: ``slope_h * j``, a key's position times the head's
        slope (BLOOM's form; ``slope_h * (j - i)`` differs by a constant per query row, which the
        softmax ignores). None without ALiBi."""
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
        """The learned position vectors ``[n, d_model]`` (GPT-2's; None without a ``pos_embed``)."""
        return self.model.bridge.W_pos[:n] if self._learned else None

    def head_parameters(self) -> dict[str, HeadAxes]:
        """None of the bridge's parameters is the encoding's own (its rotary tables are buffers
        of the model's, its ALiBi slopes read from a forward): nothing for per-head gradients."""
        return {}

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
        if self.why_not is not None:
            return self.why_not
        checked = self._check()
        return (
            checked["tables"]
            or checked["scores"]
            or f"{self.model.cfg.encoding_name}: not decomposable"
        )


def _attention_scaling(mod: Any, layer_type: Any) -> float:
    """The factor a Hugging Face rotary module multiplies its cos/sin tables by
    (``attention_scaling``, per layer type where it has one; 1 where it names none)."""
    if mod is None:
        return 1.0
    value = getattr(mod, f"{layer_type}_attention_scaling", None) if layer_type else None
    value = getattr(mod, "attention_scaling", None) if value is None else value
    return float(value) if isinstance(value, (int, float)) else 1.0


def model_rotary(bridge: Any) -> Any:
    """The model's shared rotary module: the bridge's ``rotary_emb`` component, else the Hugging
    Face model's first module named ``rotary_emb`` (None: it has none)."""
    own = getattr(bridge, "rotary_emb", None)
    if own is not None:
        return own
    for name, m in bridge.original_model.named_modules():
        if name.split(".")[-1] == "rotary_emb" and ".layers." not in f".{name}.":
            return m
    return None


def position_sources(bridge: Any) -> tuple[bool, bool, bool]:
    """``(rotary, learned, alibi)``: where a bridge's positions enter, read from its components
    and hooks (no table of model names): a rotary module or every layer's ``hook_cos``/
    ``hook_sin``; a learned position table (``pos_embed``); an ALiBi bias in the attention
    scores (:func:`pe_interp.models.bridge.alibi.alibi_slopes`: one forward of a few tokens, once per
    bridge)."""
    names = bridge.hook_dict
    n_layers = len(bridge.blocks)
    hooked = all(
        f"blocks.{i}.attn.hook_{t}" in names for i in range(n_layers) for t in ("cos", "sin")
    )
    rotary = model_rotary(bridge) is not None or hooked
    alibi = alibi_slopes(bridge) is not None
    # a model that adds ALiBi may still build a rotary module it never calls (Falcon, alibi=True)
    return rotary and not alibi, "pos_embed" in getattr(bridge, "_modules", {}), alibi


def encoding_names(bridge: Any, hf_config: Any) -> tuple[str, str]:
    """``(name, kind)`` of where a bridge's positions enter (:func:`position_sources`), for
    results and messages: "rope", or "partial rotary (f of each head)" where the config rotates a
    fraction ``f < 1`` of each head (multiplicative); "learned absolute" and "alibi" (additive);
    else "unknown"."""
    rotary, learned, alibi = position_sources(bridge)
    if rotary:
        share = (
            getattr(hf_config, "rotary_pct", None)
            or getattr(hf_config, "partial_rotary_factor", None)
            or (getattr(hf_config, "rope_parameters", None) or {}).get("partial_rotary_factor")
        )
        if share and float(share) < 1:
            return f"partial rotary ({float(share):g} of each head)", "multiplicative"
        return "rope", "multiplicative"
    if learned:
        return "learned absolute", "additive"
    if alibi:
        return "alibi", "additive"
    return "unknown", "unknown"

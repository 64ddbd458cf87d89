"""What the logit decomposition reads of a model, on our own models and on a TransformerLens bridge
(:class:`pe_interp.models.bridge.model.BridgedModel`) alike: the rotated queries and keys, the attention scale,
the entries the mask allows, and layer 0's queries and keys on a part of its input.

Our models cache the rotated vectors (``hook_rot_q``/``hook_rot_k``); a bridge over Llama caches
them too, one over GPT-NeoX does not, and there the encoding rotates ``hook_q``/``hook_k`` as the
bridge does (:meth:`pe_interp.models.bridge.model.BridgeEncoding.rotate`). A bridge masks with the dtype's
lowest value where our models write ``-inf``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["allowed", "attention_scale", "layer0_qk", "qk_hooks", "rotated_qk", "unrotated_qk"]


def qk_hooks(layer: int) -> list[str]:
    """The hooks :func:`rotated_qk` and :func:`unrotated_qk` read in ``layer``."""
    pre = f"blocks.{layer}.attn."
    return [pre + n for n in ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k")]


def rotated_qk(model: ProbeModel, cache, layer: int) -> tuple[Tensor, Tensor]:
    """The queries and keys whose scaled dot product (plus any bias) is layer ``layer``'s logit,
    ``[batch, pos, head, d]`` (grouped key/value heads repeated to one per query head)."""
    pre = f"blocks.{layer}.attn."
    names = cache.cache_dict if hasattr(cache, "cache_dict") else cache
    if pre + "hook_rot_q" in names:
        return _per_query_head(cache[pre + "hook_rot_q"], cache[pre + "hook_rot_k"])
    q, k = cache[pre + "hook_q"], cache[pre + "hook_k"]
    return _per_query_head(
        *(model.encoding.rotate(q, k, layer) if model.encoding.rotates else (q, k))
    )


def unrotated_qk(model: ProbeModel, cache, layer: int) -> tuple[Tensor, Tensor] | None:
    """The same queries and keys before the rotation, where the model caches them (a bridge's
    ``hook_q``/``hook_k``); None where only the rotated ones are cached (our models, and a bridge
    whose QK-norm sits between ``hook_q`` and the rotation: undo the rotation with the encoding's
    tables)."""
    hooks = model.encoding.unrotated_hooks
    if hooks is None:
        return None
    pre = f"blocks.{layer}.attn."
    return _per_query_head(cache[pre + hooks[0]], cache[pre + hooks[1]])


def _per_query_head(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """``k`` with its grouped key/value heads repeated as Hugging Face's ``repeat_kv`` does (key
    head ``g`` serves query heads ``g * r .. g * r + r - 1``), one per query head of ``q``."""
    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    return q, k


def attention_scale(model: ProbeModel, layer: int) -> float:
    """The factor on ``q . k`` in layer ``layer`` (the model says it)."""
    return model.attention_scale(layer)


def allowed(scores: Tensor) -> Tensor:
    """Where the mask allows an entry of ``hook_attn_scores`` (in the dtype the model wrote it):
    finite, and above half the dtype's lowest value (a bridge's mask value)."""
    return torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min / 2)


# the scales of layer 0's norms on the way to its queries and keys: ln1, and a QK-norm's (a bridge's
# q_norm/k_norm over each head or over the whole projection), frozen to make that path affine
FROZEN_SCALES = (
    "blocks.0.ln1.hook_scale",
    "blocks.0.attn.q_norm.hook_scale",
    "blocks.0.attn.k_norm.hook_scale",
)


def layer0_qk(
    model: ProbeModel,
    tokens: Tensor,
    pad_mask: Tensor | None,
    x: Tensor,
    ln_scale: Tensor | None,
    head: int,
    frozen: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Layer 0's rotated q and k of ``head`` ``[pos, d]`` on the input ``x`` (a part of the real
    input, ``[1, pos, d_model]``) with ``ln1``'s scale frozen at ``ln_scale`` (and every hook of
    ``frozen``, a QK-norm's scales of :data:`FROZEN_SCALES`, at its value): the model's own code,
    through our block's seams or, on a bridge, a forward whose ``blocks.0.hook_resid_pre`` is ``x``
    (its rotated q/k read where it hooks them, ``hook_rot_q``/``hook_rot_k``: after a QK-norm)."""
    got: dict[str, Tensor] = {}

    def grab(t: Tensor, hook: Any, name: str) -> None:
        got[name] = t

    block = model.blocks[0]
    hooks: list[tuple[str, Any]] = []
    if ln_scale is not None:
        hooks.append(("blocks.0.ln1.hook_scale", lambda scale, hook: ln_scale))
    for name, value in (frozen or {}).items():
        if name != "blocks.0.ln1.hook_scale":
            hooks.append((name, lambda scale, hook, value=value: value))
    if model.can_restart:  # a seam inside the layer (our model): the block's attention alone
        names = ("hook_rot_q", "hook_rot_k") if model.encoding.rotates else ("hook_q", "hook_k")
        hooks += [(f"blocks.0.attn.{n}", lambda t, hook, n=n: grab(t, hook, n)) for n in names]
        toks, key_valid = model.check_inputs(tokens, pad_mask)
        ctx = model.context(toks, key_valid, x if model.cfg.kv_source == "embed" else None)
        with model.hooks(fwd_hooks=hooks):
            block.attn(*block.attention_inputs(x, ctx), ctx)
        q, k = got[names[0]], got[names[1]]
    else:  # a bridge: its forward with the layer's input replaced (only layer 0's q and k are read)
        hooks.append(("blocks.0.hook_resid_pre", lambda resid, hook: x.to(resid.dtype)))
        names = ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k")
        hooks += [
            (f"blocks.0.attn.{n}", lambda t, hook, n=n: grab(t, hook, n))
            for n in names
            if f"blocks.0.attn.{n}" in model.bridge.hook_dict
        ]
        with (
            warnings.catch_warnings()
        ):  # the bridge warns that a hook edits hook_scale: that is the point
            warnings.filterwarnings("ignore", message=".*edited hook_scale")
            model.run_with_hooks(tokens, pad_mask, fwd_hooks=hooks, stop_at_layer=1)
        q, k = rotated_qk(model, {f"blocks.0.attn.{n}": got[n] for n in names if n in got}, 0)
    return q[0, :, head], k[0, :, head]

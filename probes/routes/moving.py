"""Moving a model's positions one route at a time: the interventions behind route shares
(:func:`probes.routes.shares.route_shares`).

A **route** is a head whose logits the encoding makes depend on position (rotated queries and
keys, or a positional bias), or the residual stream for an absolute encoding (``"embed"``).
:func:`position_routes` lists them; :func:`move_hooks` lets a chosen set of routes see the
positions ``σ`` instead of ``0..n-1``, by the model's own hooks.

**One head's route is a replacement of its output.** Moving head ``h`` of layer ``l`` changes
nothing before layer ``l``, and within layer ``l`` only that head's attention: each head's
pattern and output depend on its own queries, keys and values. So "route ``(l, h)`` sees ``σ``"
is the forward in which ``z_h`` of layer ``l`` (``hook_z``) is replaced by ``z'_h``, the head's
output with its positions moved on the clean input of layer ``l``. :class:`MovedOutputs` computes
``z'`` of every route head of every layer in one forward after a clean one (every route moved at
once: the heads do not see each other's positions; each layer's ``z'`` is kept and its clean ``z``
put back, so that every layer reads its clean input), and the exact ablation sweep
(:func:`probes.ablation.sweeps.sweep_batched`, with its seam after a layer's attention) runs every
route as a replacement, many per forward: the cost of an ablation grid instead of a forward from
the route's layer per route.

**Grouped key/value heads** (:class:`pe_interp.models.protocol.KVLayout`: ``group`` consecutive query
heads read one key head). A route is still a query head, and moving query head ``h`` rotates its
query and *its view* of the shared key at ``σ``; the other query heads of its group must keep
the unmoved key. :func:`move_hooks` moves a key head when any of its query heads moves (exact
when the whole group moves, as "every route at once" does); :class:`MovedOutputs` runs one
forward per index ``j`` within a group, moving query heads ``{g * group + j}`` and their keys, so
that each moved key serves exactly one moved query head, and keeps ``z'`` of those heads only:
``group`` forwards instead of one.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch import Tensor

from pe_interp.encodings import rotary_spans_for
from pe_interp.models.protocol import HOOKS, ProbeModel
from probes.common.replace import capture, capture_z

EMBED = "embed"

__all__ = [
    "EMBED",
    "MovedOutputs",
    "can_move_positions",
    "move_hooks",
    "position_routes",
    "rerotate",
]


def position_routes(model: ProbeModel) -> tuple[list[str], np.ndarray]:
    """``(extra routes, heads [n_layers, n_heads] bool)``: ``["embed"]`` when the encoding adds a
    residual term, and the heads whose logits depend on position (rotated, or a bias that varies
    over query and key positions)."""
    cfg, enc = model.cfg, model.encoding
    if (why := enc.cannot_move) is not None:  # a bridge that says so
        raise ValueError(why)
    heads = np.zeros((cfg.n_layers, cfg.n_heads), dtype=bool)
    n = min(cfg.n_ctx, 8)
    for layer in range(cfg.n_layers):
        if enc.rotates:
            spans = rotary_spans_for(enc, layer, n)
            if spans is None:
                raise ValueError(
                    f"encoding {cfg.encoding_name!r} rotates without saying how (rotary_spans); "
                    "its positional routes cannot be intervened on"
                )
            for s in spans:
                heads[layer] |= (
                    np.ones(cfg.n_heads, bool) if s.heads is None else s.heads.cpu().numpy()
                )
        with torch.no_grad():
            bias = enc.bias(n, n, layer)
        if bias is not None:
            heads[layer] |= (
                (bias.detach().flatten(1).amax(1) > bias.detach().flatten(1).amin(1)).cpu().numpy()
            )
    kv = model.kv_layout
    if kv.grouped:  # a key head moves for all its query heads or for none
        g = heads.reshape(cfg.n_layers, kv.n_kv_heads, kv.group)
        if bool((g.any(-1) != g.all(-1)).any()):
            raise ValueError(
                f"encoding {cfg.encoding_name!r} rotates only some query heads of a key/value "
                "group, whose shared keys route shares cannot move for some heads and not others"
            )
    extra = [EMBED] if enc.residual(1) is not None else []
    return extra, heads


def can_move_positions(model: ProbeModel) -> bool:
    """Whether :func:`route_shares` can move this model's positions (our own models always; a
    bridge where :class:`pe_interp.models.bridge.model.BridgeEncoding` says so, grouped key/value heads too)."""
    try:
        position_routes(model)
    except ValueError:
        return False
    return True


def rerotate(t: Tensor, spans, sigma: Tensor, heads: Tensor) -> Tensor:
    """``t [B, pos, head, d]`` (rotated at positions 0..pos-1) rotated at ``sigma [B, pos]``
    instead, for the heads marked in ``heads [B, head]`` and each span that rotates them (a
    span's query-head mask read per key head where ``t`` carries grouped keys)."""
    out = t.clone()
    n_pos = t.shape[1]
    for s in spans:
        span_heads = s.heads
        if span_heads is not None and span_heads.numel() != t.shape[2]:
            span_heads = span_heads.view(t.shape[2], -1).any(-1)
        cos_i, sin_i = s.cos[:n_pos].to(t.dtype), s.sin[:n_pos].to(t.dtype)  # [pos, half]
        cos_s, sin_s = s.cos[sigma].to(t.dtype), s.sin[sigma].to(t.dtype)  # [B, pos, half]
        c = (cos_s * cos_i + sin_s * sin_i)[:, :, None, :]  # angle sigma(i) - i
        sn = (sin_s * cos_i - cos_s * sin_i)[:, :, None, :]
        moved = s.turn(t, c, sn)
        mask = heads if span_heads is None else heads & span_heads.to(heads.device)[None]
        part = out[..., s.start : s.start + s.dim]
        out[..., s.start : s.start + s.dim] = torch.where(mask[:, None, :, None], moved, part)
    return out


def move_hooks(
    model: ProbeModel, sigma: Tensor, layer_heads: Tensor, embed_rows: Tensor, first: int
) -> list:
    """Forward hooks that let ``layer_heads [B, n_layers, n_heads]`` (and the residual term for
    ``embed_rows [B]``) see the positions ``sigma [B, pos]``, from layer ``first`` on. Where the
    key hook carries grouped key/value heads, a key head moves when any of its query heads does
    (module docstring: exact for a query head whose group moves with it or is not read)."""
    enc, hooks = model.encoding, []
    if first == 0 and bool(embed_rows.any()):

        def pos_embed(x, hook):  # [batch or 1 (a bridge's), pos, d_model]
            x = x.expand(sigma.shape[0], -1, -1)
            return torch.where(
                embed_rows[:, None, None], x.gather(1, sigma[..., None].expand_as(x)), x
            )

        hooks.append(("hook_pos_embed", pos_embed))
    for layer in range(first, model.cfg.n_layers):
        heads = layer_heads[:, layer]
        if not bool(heads.any()):
            continue
        if enc.rotates:
            spans = rotary_spans_for(enc, layer, sigma.shape[1])

            def rot(x, hook, spans=spans, heads=heads):
                return rerotate(x, spans, sigma, _per_key_head(heads, x.shape[2]))

            # after the rotation (or before it, on a bridge: one pair's rotations commute)
            hooks += [(f"blocks.{layer}.attn.{name}", rot) for name in enc.rotation_hooks]
        if not enc.has_bias:
            continue
        inside = enc.move_bias(layer, sigma, heads)
        if inside is not None:  # a bridge's BLOOM: moved inside the scores
            hooks.append((f"blocks.{layer}.attn.hook_attn_scores", inside))
        else:

            def bias(b, hook, heads=heads):  # [head, q, k] -> [B, head, q, k], gathered at sigma
                rows = sigma[:, None, :, None].expand(-1, b.shape[0], -1, b.shape[2])
                moved = b[None].expand(sigma.shape[0], -1, -1, -1).gather(2, rows)
                moved = moved.gather(3, sigma[:, None, None, :].expand_as(moved))
                return torch.where(heads[:, :, None, None], moved, b[None])

            hooks.append((f"blocks.{layer}.attn.hook_pos_bias", bias))
            # a per-row bias runs on the eager path (a hook here makes the layer eager)
            hooks.append((f"blocks.{layer}.attn.hook_attn_scores", lambda x, hook: x))
    return hooks


def _per_key_head(heads: Tensor, n: int) -> Tensor:
    """``heads [B, n_heads]`` read per head of a hook that carries ``n`` heads: itself for the
    query heads, else per key/value head, moved when any of its ``n_heads / n`` consecutive query
    heads is (:class:`pe_interp.models.protocol.KVLayout`'s grouping)."""
    if n == heads.shape[1]:
        return heads
    if heads.shape[1] % n:
        raise ValueError(f"a hook with {n} key/value heads for {heads.shape[1]} query heads")
    return heads.view(heads.shape[0], n, -1).any(-1)


def _keep_and_restore(moved: dict, clean: Tensor, layer: int, z: Tensor, hook) -> Tensor:
    """A ``hook_z`` hook: keeps ``z'`` (on the clean input of ``layer``) and puts the clean output
    back, so that the next layers read their clean input."""
    moved[layer] = z
    return clean


class MovedOutputs:
    """What replaces each route head's ``hook_z`` in the ablation sweep: its output with its
    positions moved to ``sigma`` on the clean input of its layer (module docstring). A
    :class:`probes.common.replace.Replacement`, so the exact sweeps run it like an ablation."""

    method = "positions moved"

    def __init__(
        self, model: ProbeModel, tokens: Tensor, pad_mask: Tensor, sigma: Tensor, routes: np.ndarray
    ) -> None:
        self.model, self.tokens, self.pad_mask, self.sigma = model, tokens, pad_mask, sigma
        self.routes = torch.as_tensor(routes, device=tokens.device)
        self.layers = [layer for layer in range(routes.shape[0]) if bool(routes[layer].any())]
        self.names = [HOOKS.z(layer) for layer in self.layers]

    def for_chunk(self, idx: Tensor, width: int) -> dict[str, Tensor | None]:
        """``{HOOKS.z(layer): z' [len(idx), width, n_heads, d_head]}`` for the examples ``idx`` cut
        to ``width`` columns (a cut keeps every real token; σ maps real positions to real ones)."""
        toks, pm, sig = (
            self.tokens[idx, :width],
            self.pad_mask[idx, :width],
            self.sigma[idx, :width],
        )
        if bool((sig >= width).any()):
            raise AssertionError("a width cut dropped a position that σ moves a token to")
        clean = capture_z(self.model, toks, pm, self.layers)  # what each layer's input reads
        out: dict[str, Tensor | None] = {}
        no_embed = torch.zeros(len(idx), dtype=torch.bool, device=idx.device)
        group = self.model.kv_layout.group
        index = torch.arange(self.routes.shape[1], device=idx.device) % group
        for j in range(group):  # one query head per key head moved in each forward
            mine = self.routes & (index == j)[None]  # [n_layers, n_heads]
            if not bool(mine.any()):
                continue
            heads = mine[None].expand(len(idx), -1, -1)
            moved: dict[int, Tensor] = {}

            hooks = move_hooks(self.model, sig, heads, no_embed, self.layers[0])
            hooks += [
                (HOOKS.z(layer), partial(_keep_and_restore, moved, clean[layer], layer))
                for layer in self.layers
            ]
            with self.model.hooks(fwd_hooks=hooks):
                capture(self.model, toks, pm, [], max(self.layers) + 1)
            for layer, z in moved.items():
                prev = out.get(HOOKS.z(layer))
                keep = mine[layer][None, None, :, None]
                out[HOOKS.z(layer)] = z if prev is None else torch.where(keep, z, prev)
        return out

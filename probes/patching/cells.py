"""The cells of activation patching (which activation, at which positions and heads) and the
machinery that patches many cells in one forward, starting at the patched layer (see
:mod:`probes.patching.sweep`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = [
    "BLOCK_SITES",
    "HEAD_SITES",
    "HEAD_VECTOR_SITES",
    "SITES",
    "cell_layout",
    "first_block",
    "hook_name",
    "resumes",
]

HEAD_VECTOR_SITES = ("z", "q", "k", "v")
HEAD_SITES = (*HEAD_VECTOR_SITES, "pattern")
BLOCK_SITES = ("resid_pre", "attn_out", "mlp_out")
SITES = HEAD_SITES + BLOCK_SITES


# ---------------------------------------------------------------------------------------------
# cell layouts
# ---------------------------------------------------------------------------------------------
def hook_name(site: str, layer: int) -> str:
    """TransformerLens-style hook name of ``site`` in ``layer``."""
    if site in HEAD_SITES:
        return f"blocks.{layer}.attn.hook_{site}"
    if site in BLOCK_SITES:
        return f"blocks.{layer}.hook_{site}"
    raise ValueError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")


def cell_layout(
    site: str, by_position: bool, n_pos: int, n_heads: int
) -> tuple[Tensor, tuple[int, ...], tuple[str, ...]]:
    """Boolean masks selecting each patch cell of one layer, the cell-grid shape and axis names.

    The masks have shape ``[n_cells, 1, *activation_dims]`` with singleton dims where the patch
    covers the whole axis, so ``torch.where(mask, source[None], receiver[None])`` builds the
    patched activation of every cell at once (cells in row-major order of the grid).
    """
    if site in HEAD_VECTOR_SITES:  # activation [batch, pos, head, d_head]
        if by_position:
            eye = torch.eye(n_pos * n_heads, dtype=torch.bool)
            return (
                eye.view(n_pos * n_heads, 1, n_pos, n_heads, 1),
                (n_pos, n_heads),
                ("layer", "pos", "head"),
            )
        eye = torch.eye(n_heads, dtype=torch.bool)
        return eye.view(n_heads, 1, 1, n_heads, 1), (n_heads,), ("layer", "head")
    if site == "pattern":  # activation [batch, head, dest, src]
        if by_position:
            eye = torch.eye(n_heads * n_pos, dtype=torch.bool)
            return (
                eye.view(n_heads * n_pos, 1, n_heads, n_pos, 1),
                (n_heads, n_pos),
                ("layer", "head", "dest_pos"),
            )
        eye = torch.eye(n_heads, dtype=torch.bool)
        return eye.view(n_heads, 1, n_heads, 1, 1), (n_heads,), ("layer", "head")
    if site in BLOCK_SITES:  # activation [batch, pos, d_model]
        if by_position:
            eye = torch.eye(n_pos, dtype=torch.bool)
            return eye.view(n_pos, 1, n_pos, 1), (n_pos,), ("layer", "pos")
        return torch.ones(1, 1, 1, 1, dtype=torch.bool), (), ("layer",)
    raise ValueError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")


# ---------------------------------------------------------------------------------------------
# the batched engine
# ---------------------------------------------------------------------------------------------
def _repeat(t: Tensor | None, g: int) -> Tensor | None:
    """``[n, ...] -> [g * n, ...]``, cell-major (rows ``c*n .. c*n+n-1`` belong to cell c)."""
    if t is None:
        return None
    return t.unsqueeze(0).expand(g, *t.shape).reshape(g * t.shape[0], *t.shape[1:])


def _mix(mask: Tensor, src: Tensor, recv: Tensor) -> Tensor:
    """Patched activations of ``mask.shape[0]`` cells, flattened to ``[cells * n, ...]``."""
    out = torch.where(mask, src.unsqueeze(0), recv.unsqueeze(0))
    return out.reshape(-1, *src.shape[1:])


def resumes(model: ProbeModel, site: str) -> bool:
    """Whether a model without ``forward_unchecked``'s restart (a bridge) runs a patched forward
    of a layer from that layer's input: its ``resume``, where exact, from the receiving run's
    cached input, for every site inside the block (not its input, ``resid_pre``)."""
    return model.can_resume and site != "resid_pre"


def first_block(model: ProbeModel, site: str, layer: int) -> int:
    """The first block a patched forward of ``layer`` runs: the layer itself where the model
    restarts or resumes there (:func:`resumes`), else 0 (from the embedding)."""
    return layer if model.can_restart or resumes(model, site) else 0


class Patcher:
    """Patched forwards of one example chunk: caches both runs once, then runs cell groups."""

    def __init__(
        self,
        model: ProbeModel,
        site: str,
        layers: Sequence[int],
        src_tokens,
        recv_tokens,
        src_mask,
        recv_mask,
    ):
        self.model, self.site = model, site
        self.recv_tokens, self.key_valid = model.check_inputs(recv_tokens, recv_mask)
        self.recv_mask = recv_mask
        # z, attn_out and mlp_out resume after the patched layer's attention (or MLP): the
        # layer's own input is the receiving run's, so only its output changes.
        self.late = site in ("z", "attn_out", "mlp_out")
        src_names, recv_names = set(), set()
        for layer in layers:
            recv_names.add(f"blocks.{layer}.hook_resid_pre")
            src_names.add(hook_name(site, layer))
            if self.late:
                recv_names.add(hook_name(site, layer))
                if site == "mlp_out":
                    recv_names.add(f"blocks.{layer}.hook_resid_mid")
        self.src_logits, src_cache = model.run_with_cache(
            src_tokens, src_mask, names_filter=sorted(src_names)
        )
        self.recv_logits, recv_cache = model.run_with_cache(
            recv_tokens, recv_mask, names_filter=sorted(recv_names)
        )
        self.src = {k: src_cache[k] for k in src_names}
        self.recv = {k: recv_cache[k] for k in recv_names}

    def run(self, layer: int, mask: Tensor) -> Tensor:
        """Logits ``[cells * n, n_classes]`` of the cells selected by ``mask`` in ``layer``."""
        model, site, g = self.model, self.site, mask.shape[0]
        tokens = _repeat(self.recv_tokens, g)
        key_valid = _repeat(self.key_valid, g)
        name = hook_name(site, layer)
        src = self.src[name]

        def hook(act: Tensor, hook: Any) -> Tensor:
            recv = act.reshape(g, -1, *act.shape[1:])
            out = torch.where(mask, src.unsqueeze(0), recv)
            return out.reshape(act.shape)

        if not model.can_restart:  # e.g. a bridge: from the layer's input where it resumes there
            if resumes(model, site):
                resid = _repeat(self.recv[f"blocks.{layer}.hook_resid_pre"], g)
                return model.resume(tokens, layer, resid, key_valid, fwd_hooks=[(name, hook)])
            return model.run_with_hooks(
                tokens, _repeat(self.recv_mask, g), fwd_hooks=[(name, hook)]
            )

        def resume(at: int, residual: Tensor, start_at: str = "resid_pre") -> Tensor:
            return model.forward_unchecked(
                tokens, key_valid, start_at_layer=at, residual=residual, start_at=start_at
            )

        if site == "mlp_out":  # resid_post = resid_mid + mlp_out: the next layer's input
            mid = _repeat(self.recv[f"blocks.{layer}.hook_resid_mid"], g)
            return resume(layer + 1, mid + _mix(mask, src, self.recv[name]))
        if self.late:  # resid_mid = resid_pre + attn_out; the block's MLP half onward
            attn = model.blocks[layer].attn
            if site == "z":
                z = _mix(mask, src, self.recv[name])
                attn_out = torch.einsum("bphd,hdm->bpm", z, attn.W_O) + attn.b_O
            else:
                attn_out = _mix(mask, src, self.recv[name])
            resid_pre = _repeat(self.recv[f"blocks.{layer}.hook_resid_pre"], g)
            return resume(layer, resid_pre + attn_out, "resid_mid")
        if site == "resid_pre" and layer > 0:
            return resume(layer, _mix(mask, src, self.recv[name]))
        residual = None if layer == 0 else _repeat(self.recv[f"blocks.{layer}.hook_resid_pre"], g)
        with model.hooks(fwd_hooks=[(name, hook)]):
            return resume(layer, residual)

"""What replaces an ablated head's output ``z`` (``blocks.{l}.attn.hook_z``) in each method of
:func:`probes.ablation.ablate_heads`: nothing (``zero``), its mean per position over a reference
set (``mean``, :func:`head_means`), or another example's (``resample``). Below the exact sweep
(:mod:`probes.ablation_exact`); it reads the model through its hooks only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from pe_interp.modes import eval_mode
from probes.ablation_inputs import AblationRequest, default_batch_size
from probes.inputs import check_examples, check_layers, takes_probe_model
from probes.metrics import resample_sources


def needed_width(model, pad_mask: Tensor) -> Tensor:
    """Columns each row needs: through its last real token when pads are masked, else all."""
    n = pad_mask.shape[1]
    if not model.cfg.mask_padding:
        return torch.full((pad_mask.shape[0],), n, dtype=torch.long, device=pad_mask.device)
    last = n - 1 - pad_mask.flip(1).to(torch.int8).argmax(1)
    return last + 1


@takes_probe_model
def head_means(
    model,
    tokens: Tensor,
    pad_mask: Tensor | None = None,
    *,
    layers: Iterable[int] | None = None,
    width: int | None = None,
    batch_size: int | None = None,
) -> dict[int, Tensor]:
    """Mean of ``blocks.{l}.attn.hook_z`` per position over the real tokens of ``tokens``.

    Returns ``{layer: [width, n_heads, d_head]}`` (``width`` defaults to the padded length of
    ``tokens``). Position ``p`` averages the examples whose position ``p`` is a real token;
    positions that are real in no example (beyond the reference's lengths) get the mean over
    all real tokens of all positions. With ``cfg.mask_padding=False`` every position counts as
    a token, as the model sees it.
    """
    tokens, _, pad_mask = check_examples(model, tokens, None, pad_mask)
    layers = sorted(
        set(
            range(model.cfg.n_layers)
            if layers is None
            else check_layers(model, layers, "head_means")
        )
    )
    if not layers:
        raise ValueError("head_means: layers is empty; pass None for every layer")
    return _means(
        model,
        tokens,
        pad_mask,
        layers,
        width,
        default_batch_size(model) if batch_size is None else batch_size,
    )


def _means(
    model, tokens: Tensor, pad_mask: Tensor, layers: list[int], width: int | None, batch_size: int
) -> dict[int, Tensor]:
    N, W = tokens.shape
    width = W if width is None else width
    H, D = model.cfg.n_heads, model.cfg.d_head
    sums = {
        layer: torch.zeros(W, H, D, dtype=torch.float64, device=tokens.device) for layer in layers
    }
    counts = torch.zeros(W, dtype=torch.float64, device=tokens.device)
    weights = (
        pad_mask if model.cfg.mask_padding else torch.ones_like(pad_mask)
    )  # the tokens the model sees
    need = needed_width(model, pad_mask)
    with eval_mode(model), torch.no_grad():
        for c0 in range(0, N, batch_size):
            sl = slice(c0, c0 + batch_size)
            w = int(need[sl].max())
            wt = weights[sl, :w].to(torch.float64)
            store = capture_z(model, tokens[sl, :w], pad_mask[sl, :w], layers)
            counts[:w] += wt.sum(0)
            for layer in layers:
                sums[layer][:w] += torch.einsum("bp,bphd->phd", wt, store[layer].to(torch.float64))
    out = {}
    total = counts.sum().clamp_min(1.0)
    for layer in layers:
        overall = sums[layer].sum(0) / total
        mean = torch.where(
            counts[:, None, None] > 0, sums[layer] / counts.clamp_min(1.0)[:, None, None], overall
        )
        if width > W:
            mean = torch.cat([mean, overall.expand(width - W, H, D)])
        out[layer] = mean[:width].to(model.W_E.dtype)
    return out


def capture_z(model, tokens: Tensor, pad_mask: Tensor, layers: Sequence[int]) -> dict[int, Tensor]:
    """``{layer: hook_z}`` of one forward, stopped after the last of ``layers``."""
    store: dict[int, Tensor] = {}

    def save(z, hook):
        store[int(hook.name.split(".")[1])] = z
        return None

    hooks = [(f"blocks.{layer}.attn.hook_z", save) for layer in layers]
    model.run_with_hooks(tokens, pad_mask, stop_at_layer=max(layers) + 1, fwd_hooks=hooks)
    return store


class Replacement:
    """What replaces an ablated head's ``z``, per chunk of evaluated examples."""

    def __init__(self, req: AblationRequest) -> None:
        model, tokens, pad_mask = req.model, req.tokens, req.pad_mask
        self.model, self.method = model, req.method
        self.layers = sorted({layer for unit in req.units for layer, _ in unit})
        self.means: dict[int, Tensor] = {}
        if req.method == "mean":
            rt, rp = (tokens, pad_mask) if req.reference is None else req.reference
            self.means = _means(model, rt, rp, self.layers, tokens.shape[1], req.batch_size)
        elif req.method == "resample":
            self.ref_tokens, self.ref_pm = (
                (tokens, pad_mask) if req.reference is None else req.reference
            )
            n_ref = None if req.reference is None else self.ref_tokens.shape[0]
            self.src = resample_sources(tokens.shape[0], n_ref, req.seed).to(tokens.device)
            self.ref_need = needed_width(model, self.ref_pm)

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        """``{layer: None (zero) | [width, H, D] (mean) | [len(idx), width, H, D] (resample)}``."""
        if self.method == "zero":
            return dict.fromkeys(self.layers)
        if self.method == "mean":
            return {layer: self.means[layer][:width] for layer in self.layers}
        src = self.src[idx]
        ws = max(width, int(self.ref_need[src].max()))
        z = capture_z(self.model, self.ref_tokens[src, :ws], self.ref_pm[src, :ws], self.layers)
        return {layer: z[layer][:, :width] for layer in self.layers}


def replace_hook(mask: Tensor, repl: Tensor | None, k: int, B: int) -> Callable:
    """Hook on ``hook_z`` of a batch of ``k`` stacked copies of ``B`` examples: in copy ``j``,
    replace the heads where ``mask[j]`` is True by ``repl`` (zero when None)."""
    sel = mask[:, None, None, :, None]  # [k, 1, 1, H, 1]

    def fn(z: Tensor, hook) -> Tensor:
        zv = z.reshape(k, B, *z.shape[1:])
        if repl is None:
            out = zv.masked_fill(sel, 0.0)
        elif repl.ndim == 3:  # [pos, H, D], same for every example
            out = torch.where(sel, repl.to(z.dtype)[None, None], zv)
        else:  # [B, pos, H, D], per example
            out = torch.where(sel, repl.to(z.dtype)[None], zv)
        return out.reshape(z.shape)

    return fn


def overwrite_hook(hs: list[int], repl: Tensor | None) -> Callable:
    """Hook on ``hook_z`` (the naive loop's): overwrite heads ``hs`` by ``repl`` (zero when None)."""

    def fn(z: Tensor, hook) -> Tensor:
        z = z.clone()
        for h in hs:
            if repl is None:
                z[:, :, h] = 0.0
            elif repl.ndim == 3:
                z[:, :, h] = repl[None, :, h].to(z.dtype)
            else:
                z[:, :, h] = repl[:, :, h].to(z.dtype)
        return z

    return fn


__all__ = [
    "Replacement",
    "capture_z",
    "head_means",
    "needed_width",
    "overwrite_hook",
    "replace_hook",
]

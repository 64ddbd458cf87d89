"""The parts of a head-ablation sweep below its loop (see :mod:`probes.ablation_sweep`): the one
input check of a sweep, the units it ablates, and the replacement activations of each method
(zero, mean over a reference, resampled from it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from pe_interp.modes import eval_mode
from probes.ablation_result import Head
from probes.inputs import (
    check_count,
    check_examples,
    check_finite_model,
    check_head,
    check_layer,
    check_layers,
)
from probes.metrics import (
    resample_sources,
)


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def keep_only(model_or_n_heads: Any, layer: int, head: int) -> frozenset[Head]:
    """The head set that ablates every head of ``layer`` except ``head`` ("keep only one").

    Ablating it measures how much of the layer's contribution ``head`` carries alone.
    ``model_or_n_heads`` is a model (its ``cfg.n_heads`` is used) or the number of heads."""
    n_heads = model_or_n_heads if isinstance(model_or_n_heads, int) else model_or_n_heads.cfg.n_heads
    check_head(n_heads, head, "keep_only")
    if not isinstance(model_or_n_heads, int):
        check_layer(model_or_n_heads, layer, "keep_only")
    return frozenset((layer, h) for h in range(n_heads) if h != head)


def _as_inputs(ref: Any) -> tuple[Tensor, Tensor | None]:
    if isinstance(ref, Tensor):
        return ref, None
    if isinstance(ref, tuple | list) and len(ref) == 2:
        return ref[0], ref[1]
    if hasattr(ref, "tokens"):
        return ref.tokens, getattr(ref, "pad_mask", None)
    raise ValueError("reference must be a token tensor, a (tokens, pad_mask) pair or a Batch")


def _prepare(model, tokens: Tensor, pad_mask: Tensor | None, what: str = "tokens", who: str = "") -> tuple[Tensor, Tensor]:
    mask = "pad_mask" if what == "tokens" else f"the {what}'s pad_mask"
    tokens, _, pad_mask = check_examples(model, tokens, None, pad_mask, who=who, what=what, mask_name=mask)
    return tokens, pad_mask


def _checked(model, tokens, labels, pad_mask, n_bootstrap, reference, who: str) -> tuple[Tensor, Tensor, Tensor]:
    """The checks of a sweep, before any work: finite weights, the examples, the reference, the
    bootstrap count."""
    check_finite_model(model, who)
    check_count(n_bootstrap, "n_bootstrap", 0, who)
    tokens, labels, pad_mask = check_examples(model, tokens, labels, pad_mask, who=who)
    if tokens.shape[0] == 0:
        raise ValueError(f"{who}: no examples to evaluate")
    if reference is not None:
        _prepare(model, *_as_inputs(reference), "reference", who)
    return tokens, labels, pad_mask


def _needed_width(model, pad_mask: Tensor) -> Tensor:
    """Columns each row needs: through its last real token when pads are masked, else all."""
    n = pad_mask.shape[1]
    if not model.cfg.mask_padding:
        return torch.full((pad_mask.shape[0],), n, dtype=torch.long, device=pad_mask.device)
    last = n - 1 - pad_mask.flip(1).to(torch.int8).argmax(1)
    return last + 1


def _weights(model, pad_mask: Tensor) -> Tensor:
    """Which positions count as tokens the model sees (all of them when padding is unmasked)."""
    return pad_mask if model.cfg.mask_padding else torch.ones_like(pad_mask)


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
    tokens, pad_mask = _prepare(model, tokens, pad_mask)
    batch_size = default_batch_size(model) if batch_size is None else batch_size
    layers = sorted(set(range(model.cfg.n_layers) if layers is None else check_layers(model, layers, "head_means")))
    if not layers:
        raise ValueError("head_means: layers is empty; pass None for every layer")
    N, W = tokens.shape
    width = W if width is None else width
    H, D = model.cfg.n_heads, model.cfg.d_head
    sums = {layer: torch.zeros(W, H, D, dtype=torch.float64, device=tokens.device) for layer in layers}
    counts = torch.zeros(W, dtype=torch.float64, device=tokens.device)
    weights = _weights(model, pad_mask)
    need = _needed_width(model, pad_mask)
    with eval_mode(model), torch.no_grad():
        for c0 in range(0, N, batch_size):
            sl = slice(c0, c0 + batch_size)
            w = int(need[sl].max())
            wt = weights[sl, :w].to(torch.float64)
            store: dict[int, Tensor] = {}

            def save(z, hook, store=store):
                store[int(hook.name.split(".")[1])] = z
                return None

            hooks = [(f"blocks.{layer}.attn.hook_z", save) for layer in layers]
            model.run_with_hooks(tokens[sl, :w], pad_mask[sl, :w], stop_at_layer=max(layers) + 1, fwd_hooks=hooks)
            counts[:w] += wt.sum(0)
            for layer in layers:
                sums[layer][:w] += torch.einsum("bp,bphd->phd", wt, store[layer].to(torch.float64))
    out = {}
    total = counts.sum().clamp_min(1.0)
    for layer in layers:
        overall = sums[layer].sum(0) / total
        mean = torch.where(counts[:, None, None] > 0, sums[layer] / counts.clamp_min(1.0)[:, None, None], overall)
        if width > W:
            mean = torch.cat([mean, overall.expand(width - W, H, D)])
        out[layer] = mean[:width].to(model.W_E.dtype)
    return out


def _capture_z(model, tokens: Tensor, pad_mask: Tensor, layers: Sequence[int]) -> dict[int, Tensor]:
    store: dict[int, Tensor] = {}

    def save(z, hook):
        store[int(hook.name.split(".")[1])] = z
        return None

    hooks = [(f"blocks.{layer}.attn.hook_z", save) for layer in layers]
    model.run_with_hooks(tokens, pad_mask, stop_at_layer=max(layers) + 1, fwd_hooks=hooks)
    return store


class _Replacement:
    """What replaces an ablated head's ``z``, per chunk of evaluated examples."""

    def __init__(self, model, method, tokens, pad_mask, reference, layers, seed, batch_size):
        self.model, self.method, self.layers = model, method, sorted(layers)
        self.means: dict[int, Tensor] = {}
        if method == "mean":
            rt, rp = (tokens, pad_mask) if reference is None else _as_inputs(reference)
            self.means = head_means(model, rt, rp, layers=self.layers, width=tokens.shape[1], batch_size=batch_size)
        elif method == "resample":
            if reference is None:
                self.ref_tokens, self.ref_pm = tokens, pad_mask
                self.src = resample_sources(tokens.shape[0], None, seed)
            else:
                rt, rp = _as_inputs(reference)
                self.ref_tokens, self.ref_pm = _prepare(model, rt, rp, "reference")
                if self.ref_tokens.shape[1] != tokens.shape[1]:
                    raise ValueError(
                        "resample ablation: the reference must have the padded length of the evaluated "
                        f"tokens ({tokens.shape[1]}), got {self.ref_tokens.shape[1]}"
                    )
                self.src = resample_sources(tokens.shape[0], self.ref_tokens.shape[0], seed)
            self.src = self.src.to(tokens.device)
            self.ref_need = _needed_width(model, self.ref_pm)

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        """``{layer: None (zero) | [width, H, D] (mean) | [len(idx), width, H, D] (resample)}``."""
        if self.method == "zero":
            return dict.fromkeys(self.layers)
        if self.method == "mean":
            return {layer: self.means[layer][:width] for layer in self.layers}
        src = self.src[idx]
        ws = max(width, int(self.ref_need[src].max()))
        z = _capture_z(self.model, self.ref_tokens[src, :ws], self.ref_pm[src, :ws], self.layers)
        return {layer: z[layer][:, :width] for layer in self.layers}


def default_batch_size(model) -> int:
    """Rows per forward when not given: 128 on CPU, where larger batches fall out of cache and
    run slower per row (measured at the paper's size), 2048 on an accelerator."""
    return 128 if model.W_E.device.type == "cpu" else 2048


def _units(model, layers, heads, head_sets) -> tuple[list[tuple[Head, ...]], bool]:
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def check(layer: int, head: int) -> Head:
        return check_layer(L, layer, "ablate_heads"), check_head(H, head, "ablate_heads")

    if head_sets is not None:
        if layers is not None or heads is not None:
            raise ValueError("pass either head_sets or layers/heads, not both")
        units = []
        for s in head_sets:
            unit = tuple(sorted({check(*lh) for lh in s}))
            if not unit:
                raise ValueError("head_sets: every set needs at least one (layer, head)")
            units.append(unit)
        if not units:
            raise ValueError("head_sets is empty")
        return units, False
    ls = list(range(L)) if layers is None else [check(layer, 0)[0] for layer in layers]
    hs = list(range(H)) if heads is None else [check(0, h)[1] for h in heads]
    if not ls or not hs:
        raise ValueError("nothing to ablate: layers and heads must be non-empty")
    return [((layer, h),) for layer in sorted(set(ls)) for h in sorted(set(hs))], True


def _replace_hook(mask: Tensor, repl: Tensor | None, k: int, B: int) -> Callable:
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

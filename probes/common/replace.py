"""What replaces a head's output when a probe removes it: the one replacement seam, below head
ablation (:mod:`probes.ablation.exact`), route shares (:mod:`probes.routes.moving`) and the
circuit probes (:mod:`probes.circuits`). It takes tensors, not a request, and reads the model
through its hooks only.

- :class:`Replacement` (a Protocol): per chunk of examples, what each layer's ablated heads of
  ``blocks.{l}.attn.hook_z`` become. Three frozen implementations: :class:`ZeroReplacement`
  (nothing), :class:`MeanReplacement` (the mean per position over a reference set) and
  :class:`ResampleReplacement` (another example's, from a seeded derangement or draw);
  :func:`replacement` builds one by name. Route shares' moved outputs
  (:class:`probes.routes.moving.MovedOutputs`) are a fourth.
- :func:`position_means`: the mean of any hooks' activations per position over the tokens the
  model sees (the one definition the mean ablation and the circuits' mean replacement share).
- The hooks that put a replacement in: :func:`replace_hook` (stacked copies, each its own heads)
  and :func:`overwrite_hook` (the naive loop's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from pe_interp.models.protocol import HOOKS, ProbeModel
from pe_interp.util.modes import eval_mode
from probes.common.metrics import resample_sources
from probes.common.options import ABLATION_METHODS, AblationMethod

Method = AblationMethod
METHODS = ABLATION_METHODS

__all__ = [
    "METHODS",
    "MeanReplacement",
    "Method",
    "Replacement",
    "ResampleReplacement",
    "ZeroReplacement",
    "capture",
    "capture_z",
    "needed_width",
    "overwrite_hook",
    "position_means",
    "replace_hook",
    "replacement",
]


class Replacement(Protocol):
    """What replaces the ablated heads' ``hook_z`` of ``layers``, chunk by chunk."""

    method: str  # its name, as results and progress bars say it
    layers: Sequence[int]

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        """``{layer: None (zero) | [width, H, D] (one for every row) | [len(idx), width, H, D]}``
        for the examples ``idx`` cut to ``width`` columns."""
        ...


@dataclass(frozen=True)
class ZeroReplacement:
    """``z_h = 0``: the authors' protocol (``W_V[h] = 0, b_V[h] = 0`` makes ``v_h = 0``)."""

    layers: tuple[int, ...]
    method: str = "zero"

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        return dict.fromkeys(self.layers)


@dataclass(frozen=True, eq=False)
class MeanReplacement:
    """``z_h`` at position ``p`` is its mean at ``p`` over a reference set (:func:`position_means`)."""

    layers: tuple[int, ...]
    means: dict[int, Tensor]  # {layer: [width, n_heads, d_head]}
    method: str = "mean"

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        return {layer: self.means[layer][:width] for layer in self.layers}


@dataclass(frozen=True, eq=False)
class ResampleReplacement:
    """``z_h`` of example ``i`` is that of reference example ``sources[i]``, from its own clean
    forward (one set of sources for every head, so head-to-head differences are not the sources')."""

    layers: tuple[int, ...]
    model: Any
    tokens: Tensor  # the reference's
    pad_mask: Tensor
    sources: Tensor  # [n evaluated] indices into the reference
    method: str = "resample"

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        src = self.sources[idx]
        ws = max(width, int(needed_width(self.model, self.pad_mask[src]).max()))
        z = capture_z(self.model, self.tokens[src, :ws], self.pad_mask[src, :ws], self.layers)
        return {layer: z[layer][:, :width] for layer in self.layers}


def replacement(
    model: ProbeModel,
    method: str,
    layers: Sequence[int],
    tokens: Tensor,
    pad_mask: Tensor,
    *,
    reference: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    batch_size: int = 128,
) -> Replacement:
    """The :class:`Replacement` ``method`` for the examples ``tokens`` (checked, on the model's
    device): its reference is ``reference`` (checked ``(tokens, pad_mask)``) or those examples.
    ``resample`` draws a seeded cyclic derangement of the examples, or with a reference a seeded
    uniform source each (:func:`probes.common.metrics.resample_sources`)."""
    layers = tuple(sorted(set(layers)))
    rt, rp = (tokens, pad_mask) if reference is None else reference
    if method == "zero":
        return ZeroReplacement(layers)
    if method == "mean":
        names = [HOOKS.z(layer) for layer in layers]
        means = position_means(
            model, rt, rp, names, batch_size, width=tokens.shape[1], stop_at_layer=max(layers) + 1
        )
        return MeanReplacement(layers, {layer: means[HOOKS.z(layer)] for layer in layers})
    if method == "resample":
        n_ref = None if reference is None else rt.shape[0]
        sources = resample_sources(tokens.shape[0], n_ref, seed).to(tokens.device)
        return ResampleReplacement(layers, model, rt, rp, sources)
    raise ValueError(f"unknown method {method!r}; expected one of {', '.join(map(repr, METHODS))}")


def needed_width(model: ProbeModel, pad_mask: Tensor) -> Tensor:
    """Columns each row needs: through its last real token when pads are masked, else all."""
    n = pad_mask.shape[1]
    if not model.cfg.mask_padding:
        return torch.full((pad_mask.shape[0],), n, dtype=torch.long, device=pad_mask.device)
    last = n - 1 - pad_mask.flip(1).to(torch.int8).argmax(1)
    return last + 1


def capture(
    model: ProbeModel,
    tokens: Tensor,
    pad_mask: Tensor,
    names: Sequence[str],
    stop_at_layer: int | None,
) -> dict[str, Tensor]:
    """``{name: activation}`` of one forward (``stop_at_layer``: stopped before that block)."""
    store: dict[str, Tensor] = {}
    hooks = [(n, lambda x, hook, n=n: store.__setitem__(n, x)) for n in names]
    model.run_with_hooks(tokens, pad_mask, stop_at_layer=stop_at_layer, fwd_hooks=hooks)
    return store


def capture_z(
    model: ProbeModel, tokens: Tensor, pad_mask: Tensor, layers: Sequence[int]
) -> dict[int, Tensor]:
    """``{layer: hook_z}`` of one forward, stopped after the last of ``layers``."""
    acts = capture(model, tokens, pad_mask, [HOOKS.z(layer) for layer in layers], max(layers) + 1)
    return {layer: acts[HOOKS.z(layer)] for layer in layers}


def position_means(
    model: ProbeModel,
    tokens: Tensor,
    pad_mask: Tensor,
    names: Sequence[str],
    batch_size: int,
    *,
    width: int | None = None,
    stop_at_layer: int | None = None,
) -> dict[str, Tensor]:
    """The mean of each hook's activation per position over the rows where that position is a
    token the model sees (every position when padding is unmasked), ``{name: [width, ...]}``.
    Positions that no row has (beyond the reference's lengths, up to ``width``: default the padded
    length) get the mean over all tokens of all positions. Sums in float64, returned in the model's
    dtype; each chunk runs to its longest row where pads are masked (and to ``stop_at_layer``)."""
    N, W = tokens.shape
    width = W if width is None else width
    sums: dict[str, Tensor] = {}
    counts = torch.zeros(W, dtype=torch.float64, device=tokens.device)
    weights = pad_mask if model.cfg.mask_padding else torch.ones_like(pad_mask)
    need = needed_width(model, pad_mask)
    with eval_mode(model), torch.no_grad():
        for c0 in range(0, N, batch_size):
            sl = slice(c0, c0 + batch_size)
            w = int(need[sl].max())
            wt = weights[sl, :w].to(torch.float64)
            acts = capture(model, tokens[sl, :w], pad_mask[sl, :w], names, stop_at_layer)
            counts[:w] += wt.sum(0)
            for n in names:
                s = torch.einsum("bp,bp...->p...", wt, acts[n].to(torch.float64))
                if n not in sums:
                    sums[n] = torch.zeros(W, *s.shape[1:], dtype=torch.float64, device=s.device)
                sums[n][:w] += s
    total = counts.sum().clamp_min(1.0)
    out = {}
    for n, s in sums.items():
        shape = (-1,) + (1,) * (s.ndim - 1)
        overall = s.sum(0, keepdim=True) / total
        mean = torch.where(counts.view(shape) > 0, s / counts.clamp_min(1.0).view(shape), overall)
        if width > W:
            mean = torch.cat([mean, overall.expand(width - W, *s.shape[1:])])
        out[n] = mean[:width].to(model.W_E.dtype)
    return out


def replace_hook(mask: Tensor, repl: Tensor | None, k: int, B: int) -> Callable:
    """Hook on ``hook_z`` of a batch of ``k`` stacked copies of ``B`` examples: in copy ``j``,
    replace the heads where ``mask[j]`` is True by ``repl`` (zero when None)."""
    sel = mask[:, None, None, :, None]  # [k, 1, 1, H, 1]

    def fn(z: Tensor, hook: Any) -> Tensor:
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

    def fn(z: Tensor, hook: Any) -> Tensor:
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

"""What replaces an activation when a probe removes it: the one replacement seam, below head
ablation (:mod:`probes.ablation.exact`), route shares (:mod:`probes.routes.moving`) and the
circuit probes (:mod:`probes.circuits`: edge ablation and attribution). It takes tensors, not a
request, and reads the model through its hooks only.

- :class:`Replacement` (a Protocol): per chunk of examples, what the activations at its hooks
  ``names`` become, keyed by hook name: a head ablation's ``HOOKS.z(l)``, an edge ablation's
  writer hooks (:func:`probes.circuits.engine.writer_hooks`: the embedding, each layer's
  ``hook_z`` and ``hook_mlp_out``). Three frozen implementations: :class:`ZeroReplacement`
  (nothing), :class:`MeanReplacement` (the mean per position over a reference set) and
  :class:`ResampleReplacement` (another example's, from a seeded derangement or draw; or the
  paired corrupt run's, each row its own pair, σ-aligned where asked); :func:`replacement` builds
  one by name (:data:`REPLACEMENT_METHODS`). Route shares' moved outputs
  (:class:`probes.routes.moving.MovedOutputs`) are a fourth.
- :func:`position_means`: the mean of any hooks' activations per position over the tokens the
  model sees (the one definition the mean ablation and the circuits' mean replacement share).
- :func:`filled` (a chunk's value at one hook as the live activation's shape), :func:`align`
  (σ-alignment), and the hooks that put a replacement in: :func:`replace_hook` (stacked copies,
  each its own heads) and :func:`overwrite_hook` (the naive loop's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from pe_interp.models.protocol import HOOKS, ProbeModel
from pe_interp.util.modes import eval_mode
from probes.common.metrics import resample_sources
from probes.common.options import ABLATION_METHODS, REPLACEMENT_METHODS, AblationMethod

Method = AblationMethod
METHODS = ABLATION_METHODS

__all__ = [
    "METHODS",
    "REPLACEMENT_METHODS",
    "MeanReplacement",
    "Method",
    "Replacement",
    "ResampleReplacement",
    "ZeroReplacement",
    "align",
    "capture",
    "capture_z",
    "filled",
    "needed_width",
    "overwrite_hook",
    "position_means",
    "replace_hook",
    "replacement",
]


class Replacement(Protocol):
    """What replaces the activations at the hooks ``names``, chunk by chunk."""

    method: str  # its name, as results and progress bars say it
    names: Sequence[str]  # the hooks it replaces

    def for_chunk(self, idx: Tensor, width: int) -> dict[str, Tensor | None]:
        """``{hook name: None (zero) | [width, ...] (one for every row) | [len(idx), width, ...]}``
        for the examples ``idx`` cut to ``width`` columns (``...``: the hook's own axes, e.g.
        ``[n_heads, d_head]`` at ``hook_z``)."""
        ...


@dataclass(frozen=True)
class ZeroReplacement:
    """Zero at every hook: at ``hook_z`` the authors' protocol (``W_V[h] = 0, b_V[h] = 0`` makes
    ``v_h = 0``)."""

    names: tuple[str, ...]
    method: str = "zero"

    def for_chunk(self, idx: Tensor, width: int) -> dict[str, Tensor | None]:
        return dict.fromkeys(self.names)


@dataclass(frozen=True, eq=False)
class MeanReplacement:
    """The activation at position ``p`` is its mean at ``p`` over a reference set
    (:func:`position_means`)."""

    names: tuple[str, ...]
    means: dict[str, Tensor]  # {name: [width, ...]}
    method: str = "mean"

    def for_chunk(self, idx: Tensor, width: int) -> dict[str, Tensor | None]:
        return {n: self.means[n][:width] for n in self.names}


@dataclass(frozen=True, eq=False)
class ResampleReplacement:
    """The activations of example ``i`` are those of reference example ``sources[i]``, from its
    own clean forward (one set of sources for every hook, so head-to-head differences are not the
    sources'). The paired corrupt run is one (``method="corrupt"``): its reference is the corrupt
    rows, each row its own source, and with ``sigma`` row ``i`` reads its pair at ``σ[i]``, each
    token's moved position (:func:`align`: on position-only pairs, so that a unit blind to
    position reads its own value)."""

    names: tuple[str, ...]
    model: Any
    tokens: Tensor  # the reference's
    pad_mask: Tensor
    sources: Tensor  # [n evaluated] indices into the reference
    sigma: Tensor | None = None  # [n evaluated, pos]: where row i reads its source
    method: str = "resample"

    def for_chunk(self, idx: Tensor, width: int) -> dict[str, Tensor | None]:
        src = self.sources[idx]
        ws = max(width, int(needed_width(self.model, self.pad_mask[src]).max()))
        acts = capture(
            self.model,
            self.tokens[src, :ws],
            self.pad_mask[src, :ws],
            self.names,
            _stop(self.names),
        )
        acts = align(acts, None if self.sigma is None else self.sigma[idx, :ws])
        return {n: acts[n][:, :width] for n in self.names}


def replacement(
    model: ProbeModel,
    method: str,
    names: Sequence[str],
    tokens: Tensor,
    pad_mask: Tensor,
    *,
    reference: tuple[Tensor, Tensor] | None = None,
    sigma: Tensor | None = None,
    seed: int = 0,
    batch_size: int = 128,
) -> Replacement:
    """The :class:`Replacement` ``method`` at the hooks ``names`` for the examples ``tokens``
    (checked, on the model's device): its reference is ``reference`` (checked ``(tokens,
    pad_mask)``) or those examples. ``resample`` draws a seeded cyclic derangement of the examples,
    or with a reference a seeded uniform source each
    (:func:`probes.common.metrics.resample_sources`); ``corrupt`` reads the reference, the paired
    corrupt rows, row by row (at ``sigma``, where given)."""
    names = tuple(dict.fromkeys(names))
    rt, rp = (tokens, pad_mask) if reference is None else reference
    if method == "zero":
        return ZeroReplacement(names)
    if method == "mean":
        means = position_means(
            model, rt, rp, names, batch_size, width=tokens.shape[1], stop_at_layer=_stop(names)
        )
        return MeanReplacement(names, means)
    if method == "resample":
        n_ref = None if reference is None else rt.shape[0]
        sources = resample_sources(tokens.shape[0], n_ref, seed).to(tokens.device)
        return ResampleReplacement(names, model, rt, rp, sources)
    if method == "corrupt":
        assert reference is not None and reference[0].shape == tokens.shape
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        return ResampleReplacement(names, model, rt, rp, rows, sigma, method="corrupt")
    raise ValueError(
        f"unknown method {method!r}; expected one of {', '.join(map(repr, REPLACEMENT_METHODS))}"
    )


def _stop(names: Sequence[str]) -> int | None:
    """The block to stop a forward before so that every hook of ``names`` has fired: after the
    last block they sit in, or None (the whole forward) where one sits outside the blocks."""
    blocks = [re.match(r"blocks\.(\d+)\.", n) for n in names]
    if not blocks or not all(blocks):
        return None
    return max(int(m.group(1)) for m in blocks if m) + 1


def filled(value: Tensor | None, like: Tensor) -> Tensor:
    """A replacement's value at one hook (None: zero; ``[width, ...]``: every row) as ``like``, the
    live activation ``[rows, width, ...]``."""
    if value is None:
        return torch.zeros_like(like)
    return value[None].expand_as(like) if value.ndim < like.ndim else value


def align(acts: dict[str, Tensor], sigma: Tensor | None) -> dict[str, Tensor]:
    """Each ``[b, pos, ...]`` activation read at ``σ``: row ``b``, position ``i`` takes position
    ``σ[b, i]`` (the corrupt run's value of the clean token at ``i``). ``σ`` None: unchanged."""
    if sigma is None:
        return acts
    return {
        n: a.gather(1, sigma.view(*sigma.shape, *[1] * (a.ndim - 2)).expand_as(a))
        for n, a in acts.items()
    }


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

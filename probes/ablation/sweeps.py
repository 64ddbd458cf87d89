"""The exact sweep: every unit (a set of heads) replaced on every example, one metric value each.

:func:`exact_sweep` is the one entry, for head ablation (:mod:`probes.ablation.exact`) and route
shares (:mod:`probes.routes.shares`) alike: it takes a :class:`Sweep` (checked examples, units, a
metric) and a :class:`~probes.common.replace.Replacement`, and chooses the engine once:
:func:`sweep_batched` through the model's seam inside a layer, :func:`sweep_stacked` for a model
that restarts at a layer's input or only from the embedding, or :func:`sweep_naive`, the slow
reference. Each returns ``(baseline [N], values [units, N])`` per example; how they are fast
without approximating anything is in :mod:`probes.ablation.exact`'s docstring."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pe_interp.models.protocol import HOOKS
from probes.common.inputs import FiniteWatch
from probes.common.metrics import Metric
from probes.common.progress import SweepProgress
from probes.common.replace import Replacement, needed_width, overwrite_hook, replace_hook

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel
    from probes.ablation.result import Head


@dataclass(frozen=True, eq=False)
class Sweep:
    """What an exact sweep runs, checked by its caller: the examples, the units each copy replaces,
    and the metric of each row."""

    model: ProbeModel
    tokens: Tensor  # [N, pos] int64 on the model's device
    labels: Tensor  # [N]: class labels, or row indices where the metric reads its rows' own pairs
    pad_mask: Tensor  # [N, pos] bool, True at real tokens
    units: list[tuple[Head, ...]]  # the heads each copy replaces
    metric: Metric  # metric(logits, labels) -> [rows]
    batch_size: int  # rows per forward
    progress: bool = False  # a bar with an ETA


def exact_sweep(
    sweep: Sweep, repl: Replacement, watch: FiniteWatch, *, naive: bool = False
) -> tuple[Tensor, Tensor]:
    """``(baseline [N], values [units, N])``: every unit of ``sweep`` replaced by ``repl`` on every
    example, by the engine the model allows (module docstring); ``naive``: the slow reference."""
    run = sweep_naive if naive else sweep_batched if sweep.model.can_restart else sweep_stacked
    return run(sweep, watch, repl)


def even_split(n: int, most: int) -> int:
    """The size of the fewest equal parts of ``n`` items with at most ``most`` in each (16 items at
    most 14 a part: 8 and 8, not 14 and 2)."""
    most = max(1, min(n, most))
    parts = -(-n // most)
    return -(-n // parts)


def unit_masks(part: list[tuple], n_heads: int, device) -> dict[int, Tensor]:
    """``{layer: [len(part), n_heads]}``: True where copy ``j`` ablates that head of that layer."""
    masks: dict[int, Tensor] = {}
    for j, unit in enumerate(part):
        for layer, h in unit:
            masks.setdefault(
                layer, torch.zeros(len(part), n_heads, dtype=torch.bool, device=device)
            )[j, h] = True
    return masks


def sweep_batched(req: Sweep, watch: FiniteWatch, repl: Replacement) -> tuple[Tensor, Tensor]:
    """The fast sweep (module docstring): ``(baseline [N], values [units, N])`` per example."""
    model, tokens, labels, pad_mask, units = (
        req.model,
        req.tokens,
        req.labels,
        req.pad_mask,
        req.units,
    )
    batch_size, progress, metric = req.batch_size, req.progress, req.metric
    N, W = tokens.shape
    H = model.cfg.n_heads
    need = needed_width(model, pad_mask)
    order = (
        torch.argsort(need, stable=True)
        if model.cfg.mask_padding
        else torch.arange(N, device=tokens.device)
    )
    groups: dict[int, list[int]] = {}
    for u, unit in enumerate(units):
        groups.setdefault(min(layer for layer, _ in unit), []).append(u)
    kmax = max(len(g) for g in groups.values())
    ex_chunk = even_split(N, batch_size // kmax)
    base = torch.empty(N, dtype=torch.float64)
    vals = torch.full((len(units), N), float("nan"), dtype=torch.float64)
    starts = sorted(groups)
    L = model.cfg.n_layers
    bar = SweepProgress(
        progress,
        f"ablate ({repl.method})",
        N * (L + sum(len(g) * (L - s) for s, g in groups.items())),
        len(units),
        N,
    )
    for c0 in range(0, N, ex_chunk):
        idx = order[c0 : c0 + ex_chunk]
        idx_cpu = idx.cpu()
        B = len(idx)
        w = int(need[idx].max())
        toks, pm, lab = tokens[idx, :w], pad_mask[idx, :w], labels[idx]
        key_valid = model.check_inputs(toks, pm)[1]  # once per chunk; the copies reuse it
        cache: dict[tuple[str, int], Tensor] = {}

        def save(x, hook, kind, layer, cache=cache):
            cache[(kind, layer)] = x

        saves = [(HOOKS.resid_mid(s), partial(save, kind="mid", layer=s)) for s in starts]
        saves += [(HOOKS.z(s), partial(save, kind="z", layer=s)) for s in starts]
        logits = model.run_with_hooks(toks, pm, fwd_hooks=saves)
        base[idx_cpu] = metric(watch.see(logits), lab).cpu()
        bar.update(B * L)
        replacement = repl.for_chunk(idx, w)
        for s in starts:
            uids = groups[s]
            k = even_split(len(uids), batch_size // B)
            # Layer s's attention is the clean one in every copy except for the ablated heads:
            # each adds its change of output, (replacement - z_h) @ W_O[h].
            z = cache[("z", s)]
            r = replacement[HOOKS.z(s)]
            diff = -z if r is None else (r.to(z.dtype) if r.ndim == 4 else r.to(z.dtype)[None]) - z
            W_O = model.blocks[s].attn.W_O
            for j0 in range(0, len(uids), k):
                part = uids[j0 : j0 + k]
                kk = len(part)
                masks = unit_masks([units[u] for u in part], H, tokens.device)
                hooks = [
                    (HOOKS.z(layer), replace_hook(m, replacement[HOOKS.z(layer)], kk, B))
                    for layer, m in masks.items()
                    if layer != s
                ]
                hp = masks[s].any(0).nonzero()[:, 0]  # heads of layer s ablated in this batch
                sel = masks[s].to(diff.dtype)  # [kk, H]
                if len(hp) <= kk:  # one output change per head, then pick them per copy
                    contrib = torch.einsum("bphd,hdm->hbpm", diff[:, :, hp], W_O[hp])
                    delta = torch.einsum("kh,hbpm->kbpm", sel[:, hp], contrib)
                else:  # many heads per copy (e.g. keep-only sets): mask, then one product
                    delta = torch.einsum(
                        "kbphd,hdm->kbpm", diff[None] * sel[:, None, None, :, None], W_O
                    )
                mid = (cache[("mid", s)][None] + delta).reshape(kk * B, w, -1)
                kv = None if key_valid is None else key_valid.repeat(kk, 1)
                with model.hooks(fwd_hooks=hooks):
                    out = model.forward_unchecked(
                        toks.repeat(kk, 1), kv, start_at_layer=s, residual=mid, start_at="resid_mid"
                    )
                m = metric(watch.see(out), lab.repeat(kk)).view(kk, B).cpu()
                vals[torch.tensor(part)[:, None], idx_cpu[None, :]] = m
                bar.update(kk * B * (L - s), kk * B)
    bar.close()
    return base, vals


def sweep_stacked(req: Sweep, watch: FiniteWatch, repl: Replacement) -> tuple[Tensor, Tensor]:
    """Many ablations per forward (step 3 of the module docstring) without the seam inside a layer:
    each of ``k`` stacked copies of a chunk has its own heads replaced on ``hook_z``, from the
    input of the ablations' first layer where the model resumes there exactly
    (``model.can_resume``: step 2 without its last part), else from the embedding. For models
    without :meth:`~pe_interp.HookedPETransformer.forward_unchecked` (``model.can_restart``
    False, e.g. :class:`pe_interp.models.bridge.model.BridgedModel`, whose restart runs the ablated layer and
    the later ones only, and unembeds only the read position); the padding cut of step 4 applies.
    An ablation of layer ``l`` then costs ``(L - l) / L`` of a forward: a whole grid
    ``(L + 1) / 2`` layers per head, at most ``2L / (L + 1)`` times faster than one whole forward per
    head (``benchmarks/smollm2.py``)."""
    model, tokens, labels, pad_mask, units = (
        req.model,
        req.tokens,
        req.labels,
        req.pad_mask,
        req.units,
    )
    batch_size, metric, H = req.batch_size, req.metric, model.cfg.n_heads
    resumes = model.can_resume
    N = tokens.shape[0]
    need = needed_width(model, pad_mask)
    order = (
        torch.argsort(need, stable=True)
        if model.cfg.mask_padding
        else torch.arange(N, device=tokens.device)
    )
    groups: dict[int, list[int]] = {}
    for u, unit in enumerate(units):
        groups.setdefault(min(layer for layer, _ in unit) if resumes else 0, []).append(u)
    ex_chunk = even_split(N, batch_size // max(len(g) for g in groups.values()))
    base = torch.empty(N, dtype=torch.float64)
    vals = torch.full((len(units), N), float("nan"), dtype=torch.float64)
    L = model.cfg.n_layers
    bar = SweepProgress(
        req.progress,
        f"ablate ({repl.method}, stacked)",
        N * (L + sum(len(g) * (L - s) for s, g in groups.items())),
        len(units),
        N,
    )
    for c0 in range(0, N, ex_chunk):
        idx = order[c0 : c0 + ex_chunk]
        idx_cpu, B, w = idx.cpu(), len(idx), int(need[idx].max())
        toks, pm, lab = tokens[idx, :w], pad_mask[idx, :w], labels[idx]
        resid: dict[int, Tensor] = {}

        def save(x, hook, layer, resid=resid):
            resid[layer] = x

        hooks = [
            (f"blocks.{s}.hook_resid_pre", partial(save, layer=s))
            for s in groups
            if resumes and s > 0
        ]
        base[idx_cpu] = metric(
            watch.see(model.run_with_hooks(toks, pm, fwd_hooks=hooks)), lab
        ).cpu()
        bar.update(B * L)
        key_valid = model.check_inputs(toks, pm)[1]
        replacement = repl.for_chunk(idx, w)
        for s, uids in groups.items():
            k = even_split(len(uids), batch_size // B)
            for j0 in range(0, len(uids), k):
                part = uids[j0 : j0 + k]
                kk = len(part)
                masks = unit_masks([units[u] for u in part], H, tokens.device)
                hooks = [
                    (HOOKS.z(layer), replace_hook(m, replacement[HOOKS.z(layer)], kk, B))
                    for layer, m in masks.items()
                ]
                if s in resid:
                    kv = None if key_valid is None else key_valid.repeat(kk, 1)
                    out = model.resume(
                        toks.repeat(kk, 1), s, resid[s].repeat(kk, 1, 1), kv, fwd_hooks=hooks
                    )
                else:
                    out = model.run_with_hooks(
                        toks.repeat(kk, 1), pm.repeat(kk, 1), fwd_hooks=hooks
                    )
                vals[torch.tensor(part)[:, None], idx_cpu[None, :]] = (
                    metric(watch.see(out), lab.repeat(kk)).view(kk, B).cpu()
                )
                bar.update(kk * B * (L - s), kk * B)
    bar.close()
    return base, vals


def sweep_naive(req: Sweep, watch: FiniteWatch, repl: Replacement) -> tuple[Tensor, Tensor]:
    """One full forward (all layers, full padded width) per ablation and batch of examples."""
    model, tokens, labels, pad_mask, units = (
        req.model,
        req.tokens,
        req.labels,
        req.pad_mask,
        req.units,
    )
    batch_size, progress, metric = req.batch_size, req.progress, req.metric
    N, W = tokens.shape
    base = torch.empty(N, dtype=torch.float64)
    vals = torch.empty((len(units), N), dtype=torch.float64)
    L = model.cfg.n_layers
    bar = SweepProgress(progress, "ablate (naive)", N * L * (1 + len(units)), len(units), N)
    for c0 in range(0, N, batch_size):
        idx = torch.arange(c0, min(N, c0 + batch_size), device=tokens.device)
        toks, pm, lab = tokens[idx], pad_mask[idx], labels[idx]
        base[idx.cpu()] = metric(watch.see(model(toks, pm)), lab).cpu()
        bar.update(len(idx) * L)
        replacement = repl.for_chunk(idx, W)
        for u, unit in enumerate(units):
            by_layer: dict[int, list[int]] = {}
            for layer, h in unit:
                by_layer.setdefault(layer, []).append(h)

            hooks = [
                (HOOKS.z(layer), overwrite_hook(hs, replacement[HOOKS.z(layer)]))
                for layer, hs in by_layer.items()
            ]
            vals[u, idx.cpu()] = metric(
                watch.see(model.run_with_hooks(toks, pm, fwd_hooks=hooks)), lab
            ).cpu()
            bar.update(len(idx) * L, len(idx))
    bar.close()
    return base, vals


__all__ = [
    "SweepProgress",
    "even_split",
    "sweep_batched",
    "sweep_naive",
    "sweep_stacked",
    "unit_masks",
]

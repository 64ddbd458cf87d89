"""One receiver site of :func:`probes.circuits.path_patching.path_patch`: every sender's clean-minus-
corrupt term added at the receivers of one layer and kind, on the corrupt run. On a model with
restart seams (ours) the layer restarts from the cached residual (:func:`site_restarted`); on a
bridge each (sender, receiver) pair is one copy of the whole corrupt run, the term added at that
receiver's input hook alone (:func:`site_hooked`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from probes.circuits.engine import attend_with, merge_hooks, to_fork
from probes.circuits.graph import parse

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def site_restarted(
    model: ProbeModel, run, acts, delta, layer, kind, comp, receivers, senders, fn, good, bad, rows
) -> np.ndarray:
    """Summed metric ``[len(senders), len(receivers)]`` for one receiver layer and kind."""
    b = len(run)
    out = np.zeros((len(senders), len(receivers)))
    L = model.cfg.n_layers

    def resume(start: int, residual, reps: int, at: str = "resid_pre", hooks=()):
        tokens = run.tokens.repeat(reps, 1)
        kv = None if run.key_valid is None else run.key_valid.repeat(reps, 1)
        with model.hooks(fwd_hooks=list(hooks)):
            logits = model.forward_unchecked(
                tokens, kv, start_at_layer=start, residual=residual, start_at=at
            )
        return fn(logits, good.repeat(reps), bad.repeat(reps)).double().view(reps, b).sum(1)

    per = max(1, rows // b)
    if kind in ("logits", "mlp"):
        for s0 in range(0, len(senders), per):
            d = delta[:, :, list(senders[s0 : s0 + per])].permute(2, 0, 1, 3)  # [k, b, p, d]
            kk = d.shape[0]
            if kind == "logits":
                final = acts[f"blocks.{L - 1}.hook_resid_post"]
                out[s0 : s0 + kk, 0] = (
                    resume(L, (final[None] + d).reshape(-1, *final.shape[1:]), kk).cpu().numpy()
                )
            else:
                mid = acts[f"blocks.{layer}.hook_resid_mid"].repeat(kk, 1, 1)
                add = (f"blocks.{layer}.hook_mlp_in", lambda x, hook, d=d: x + d.reshape(x.shape))
                out[s0 : s0 + kk, 0] = resume(layer, mid, kk, "resid_mid", [add]).cpu().numpy()
        return out
    attn = model.blocks[layer].attn
    heads = [parse(r).head for r in receivers]
    resid = acts[f"blocks.{layer}.hook_resid_pre"]
    mid = acts[f"blocks.{layer}.hook_resid_mid"]
    kv_in = acts["blocks.0.hook_resid_pre"] if model.cfg.kv_source == "embed" else None
    # the unpatched z by the same code path as the patched ones
    z_base = attend_with(
        model, layer, run, resid, kv_in, comp, torch.zeros_like(resid), ["hook_z"]
    )["hook_z"]
    for s0 in range(0, len(senders), per):
        d = delta[:, :, list(senders[s0 : s0 + per])].permute(2, 0, 1, 3)
        kk = d.shape[0]
        seen = attend_with(
            model,
            layer,
            run,
            resid.repeat(kk, 1, 1),
            kv_in,
            comp,
            d.reshape(-1, *d.shape[2:]),
            ["hook_z"],
        )
        z = seen["hook_z"].view(kk, b, *z_base.shape[1:])
        change = torch.einsum(
            "kbphd,hdm->khbpm", (z - z_base[None])[:, :, :, heads], attn.W_O[heads]
        )  # [k, R, b, p, d]
        per_r = max(1, per // kk)
        for r0 in range(0, len(heads), per_r):
            ch = change[:, r0 : r0 + per_r]
            reps = ch.shape[0] * ch.shape[1]
            res = resume(
                layer, (mid[None, None] + ch).reshape(-1, *mid.shape[1:]), reps, "resid_mid"
            )
            out[s0 : s0 + kk, r0 : r0 + ch.shape[1]] = res.view(kk, -1).cpu().numpy()
    return out


def site_hooked(
    model: ProbeModel,
    graph,
    run,
    delta,
    layer,
    kind,
    comp,
    receivers,
    senders,
    valid,
    fn,
    good,
    bad,
    rows,
) -> np.ndarray:
    """What :func:`site_restarted` sums, for a model without restart seams (a bridge): each valid (sender,
    receiver) pair is one copy of the corrupt run, the sender's delta added at that receiver's
    input hook alone (its own head's fork, the MLP's input or the final residual); in the ungrouped
    view a forward split ``graph.kv_split`` ways (:func:`probes.circuits.engine.to_fork`)."""
    b, split = len(run), graph.kv_split
    heads: list[int | None] = [None]
    n_slots = 0  # a fork's heads
    if kind == "logits":
        hook = f"blocks.{graph.n_layers - 1}.hook_resid_post"
    elif kind == "mlp":
        hook = f"blocks.{layer}.{graph.mlp_in_hook}"
    else:
        # the receiver's slot in its fork: its query head, or a grouped k/v reader's key/value head
        slots = [(s.head if s.kv is None else s.kv) for s in map(parse, receivers)]
        hook, heads = f"blocks.{layer}.attn.hook_{comp}_input", slots
        n_slots = len(graph.fork_readers(layer, comp))
    pairs = [(i, j) for i, j in zip(*np.nonzero(valid))]
    out = np.zeros(valid.shape)
    per = max(1, rows // b)
    for p0 in range(0, len(pairs), per):
        chunk = pairs[p0 : p0 + per]
        k = len(chunk)
        d = delta[:, :, [int(senders[i]) for i, _ in chunk]].permute(2, 0, 1, 3)  # [k, b, p, d]
        at = torch.tensor([0 if heads[j] is None else heads[j] for _, j in chunk], device=d.device)

        def add(x, hook, d=d, at=at, k=k, site=hook):
            if heads[0] is None:
                return x + to_fork(d.reshape(k * b, *d.shape[2:]), site, split)
            t = d.new_zeros(k, b, d.shape[2], n_slots, d.shape[3])  # [k, b, p, slots, d]
            t[torch.arange(k, device=d.device), :, :, at] = d
            return x + to_fork(t.view(k * b, *t.shape[2:]), site, split)

        tokens = run.tokens.repeat(k * split, 1)
        kv = None if run.key_valid is None else run.key_valid.repeat(k * split, 1)
        with model.hooks(fwd_hooks=merge_hooks(model, split) + [(hook, add)]):
            logits = model.forward_unchecked(tokens, kv)[: k * b]
        sums = fn(logits, good.repeat(k), bad.repeat(k)).double().view(k, b).sum(1).cpu().numpy()
        for (i, j), v in zip(chunk, sums):
            out[i, j] = v
    return out


__all__ = ["site_hooked", "site_restarted"]

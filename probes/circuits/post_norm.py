"""Edges where a norm follows a block's attention or MLP (Gemma 2 and 3, OLMo 2; issue 55, item 2).

Such a block adds ``N(S)`` to the residual, ``S = sum_h z_h W_O[h] + b_O`` (or the MLP's output),
so no head has a residual term of its own. A writer's term is read inside the norm
(:func:`probes.circuits.engine.writer_term`: ``z_h W_O[h]``, the MLP's output before its norm) and an
edge is defined as it acts: the receiver's input with the sender's term replaced inside the norm's
sum and the norm recomputed, by the model's own norm module
(:meth:`pe_interp.models.protocol.ProbeModel.post_norm`):

- exact edge ablation and faithfulness (:func:`probes.circuits.edge_ablation.ablated_metric`): a
  receiver ``r`` reads ``live + N(S + sum_{w ablated for r} (repl_w - live_w)) - N(S)`` from each
  normed block, ``S`` the live run's own;
- path patching: ``N(S' + t_w - t'_w) - N(S')`` added to the receiver in the corrupt run (primes);
- attribution linearises through the norm's Jacobian (:data:`LINEARISATION`, recorded in
  ``Attribution.meta["post_norm"]``): a writer's term difference ``t`` becomes ``J_N(S) t`` at the
  run where the gradient is taken (each interpolation step of EAP-IG), so an edge's score is the
  derivative of the exact edge ablation above, and a writer's edges add up to its node score.

The embedding and a block without such a norm keep their residual terms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from probes.circuits.engine import writer_chunks
from probes.circuits.graph import Graph

if TYPE_CHECKING:
    from pe_interp.models.protocol import PostNorm, ProbeModel

LINEARISATION = "jacobian"
"""How attribution carries a term through a norm after the block (``Attribution.meta["post_norm"]``)."""


def post_norms(model: ProbeModel, graph: Graph) -> dict[str, PostNorm]:
    """``{writer hook: the norm after its block}`` for every writer hook whose terms a norm maps to
    the residual; empty for a model without such norms."""
    out = {}
    for layer in range(graph.n_layers):
        branches = [("attn", f"blocks.{layer}.attn.hook_z")]
        if graph.has_mlp:
            branches.append(("mlp", f"blocks.{layer}.{graph.mlp_out_hook}"))
        for branch, hook in branches:
            norm = model.post_norm(layer, branch)
            if norm is not None:
                out[hook] = norm
    return out


def norm_inputs(norms: dict[str, PostNorm]) -> list[str]:
    """The hooks that read the norms' inputs, in block order."""
    return list(dict.fromkeys(n.hook_in for n in norms.values()))


def renormed(norm: PostNorm, at: Tensor, change: Tensor) -> Tensor:
    """``N(S + change) - N(S)``: what a change inside the norm's sum adds to the residual, ``S``
    (``at``) broadcast against ``change`` on the leading axes."""
    return norm.norm(at + change) - norm.norm(at)


def through_norms(
    norms: dict[str, PostNorm],
    graph: Graph,
    terms: Tensor,
    acts: dict[str, Tensor],
    *,
    exact: bool,
) -> Tensor:
    """Writers' term differences ``[b, pos, writers, d]`` (each inside its norm, as
    :func:`probes.circuits.engine.contributions` gives them) as residual terms: ``N(S + t) - N(S)``
    (``exact``) or ``J_N(S) t`` (the norm's Jacobian), one writer at a time, with ``S`` the norm's
    input in ``acts`` (``[b, pos, d]``); unchanged where no norm follows the writer's block."""
    if not norms:
        return terms
    parts = []
    for name, c0, n in writer_chunks(graph):
        if c0 >= terms.shape[2]:
            break
        t = terms[:, :, c0 : c0 + n]  # [b, pos, n, d]
        norm = norms.get(name)
        if norm is None:
            parts.append(t)
            continue
        at = acts[norm.hook_in][:, :, None]  # [b, pos, 1, d]
        if exact:
            parts.append(renormed(norm, at, t))
        else:  # forward-mode: the primal needs its own memory, not a broadcast view
            parts.append(torch.func.jvp(norm.norm, (at.expand_as(t).contiguous(),), (t,))[1])
    return torch.cat(parts, dim=2)


__all__ = ["LINEARISATION", "norm_inputs", "post_norms", "renormed", "through_norms"]

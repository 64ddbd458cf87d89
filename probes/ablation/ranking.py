"""Heads ranked by integrated gradients along the ablation path: the engine of
``ablate_heads(engine="attribution")``.

Ablating head ``h`` moves its output ``z_h`` from its live value to ``other_h`` (zero, its mean
per position, or a resampled example's). Write ``z_h(a) = other_h + a (z_h - other_h)`` and
``m(a)`` for the per-example metric with every head at ``a``: the change ablation causes is
``m(0_h) - m(1) = -integral_0^1 dm/da_h da``. A first-order estimate (attribution patching) takes
the derivative at ``a = 1`` only and misses heads whose output scale sits near a stationary
point there; here it is integrated by Gauss-Legendre quadrature with ``steps`` nodes along one
of two paths that share their gradients between heads:

- ``"joint"`` (default): every head of every layer at the same ``a`` (``steps`` forwards and
  backwards of the whole model);
- ``"layer"``: the heads of one layer at ``a``, the other layers at 1 (``n_layers x steps``);
- ``"clean"``: no integral, the derivative at ``a = 1`` only (attribution patching, AtP: every
  head live, as a single head's ablation leaves the others; ``steps`` must be 1);
- ``"hvp"``: the clean point's second-order Taylor estimate (after Zhang & Wang 2026, arXiv
  2606.09899), ``m(0_h) - m(1) ~ -g_h + q_h / 2`` with ``g = dm/da`` and ``q_h`` the Hessian's
  diagonal ``d2m/da_h2``, read from Hessian-vector products (double backward): the heads are
  dealt round-robin into ``steps`` probes, each a vector of seeded random signs ``v`` on its
  heads (:func:`hvp_probes`), and ``q_h = v_h (H v)_h`` (Hutchinson's diagonal estimator: exact
  where a probe holds one head, ``steps = n_layers x n_heads``; with more heads to a probe, the
  cross terms ``v_h v_h' H_hh'`` of its other heads enter with random signs). One probe costs
  one forward, one backward and one more. Each head's ``reliability`` is ``|q_h / 2| / |g_h|``
  (means over examples): the second-order term against the first; above 1 the series has not
  settled and the head is ``flagged``, for an exact check (``Attribution`` verifies them).

The derivative of each head's scale is taken per example (rows are independent), so the
estimate is in the units of the metric the exact grid reports:

- ``"accuracy"``: the margin (true logit minus the largest other) integrated per example, and an
  example counted wrong after ablating ``h`` when its margin plus that change is below zero;
  the estimate is the share of examples that flip, right to wrong minus wrong to right.
- ``"loss"``: cross-entropy; ``"logit"``: the true class's logit; ``"margin"``, ``"logprob"``:
  their means (drops positive when the ablation hurts, as :func:`probes.ablate_heads`: a rise of
  the loss, a fall of the others).

``replace``: any :class:`probes.common.replace.Replacement` instead of ``method``'s (the layers
whose ``hook_z`` it does not list keep their live output, so their heads' estimates are 0): route
shares screen each head's moved positions this way (:mod:`probes.routes.screen`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from pe_interp.models.protocol import HOOKS, ProbeModel
from pe_interp.util.modes import eval_mode
from probes.common.inputs import takes_probe_model
from probes.common.metrics import margin
from probes.common.options import INTEGRATION_PATHS, SURROGATES
from probes.common.replace import Replacement, filled, replacement

PATHS = INTEGRATION_PATHS


def _per_example(surrogate: Any, logits: Tensor, labels: Tensor) -> Tensor:
    """The differentiable per-example quantity whose change is integrated (higher is better)."""
    if callable(surrogate):
        return surrogate(logits, labels)
    if surrogate in ("accuracy", "margin"):
        return margin(logits, labels)
    if surrogate in ("loss", "logprob"):
        return logits.log_softmax(-1).gather(1, labels[:, None])[:, 0]
    return logits.gather(1, labels[:, None])[:, 0]


def _nodes(steps: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(steps)
    return (x + 1) / 2, w / 2


def _others(model: ProbeModel, tokens, pad_mask, method, reference, seed, rows) -> Replacement:
    """What replaces every head of every layer (:mod:`probes.common.replace`), for the examples."""
    if method == "mean" and reference is not None and reference[0].shape[1] < tokens.shape[1]:
        raise ValueError(
            f"rank_heads: the mean's reference is shorter ({reference[0].shape[1]}) than the "
            f"examples ({tokens.shape[1]})"
        )
    names = [HOOKS.z(layer) for layer in range(model.cfg.n_layers)]
    return replacement(
        model, method, names, tokens, pad_mask, reference=reference, seed=seed, batch_size=rows
    )


@takes_probe_model
def rank_heads(
    model: ProbeModel,
    tokens: Tensor,
    labels: Tensor,
    pad_mask: Tensor,
    *,
    method: str = "zero",
    reference: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    surrogate: Any = "accuracy",
    steps: int = 4,
    path: str = "joint",
    batch_size: int | None = None,
    replace: Replacement | None = None,
) -> dict[str, Any]:
    """Each head's estimated harm when ablated by ``method`` (see the module docstring).

    ``surrogate``: one of :data:`SURROGATES` or ``fn(logits, labels) -> [n]`` (differentiable,
    higher is better). ``tokens``, ``labels``, ``pad_mask``: checked inputs on the model's device; ``reference``:
    ``(tokens, pad_mask)`` for ``mean`` and ``resample`` (default the evaluated examples).
    Returns ``{"estimate": [n_layers, n_heads] (positive = hurts), "tiebreak" (the mean fall of
    the integrated quantity, which orders heads of equal estimate: accuracy estimates are counts),
    "baseline" (the metric's clean mean), "surrogate", "steps", "path", "per_example_change"
    ([n, n_layers, n_heads])}``; ``path="hvp"`` adds ``"first_order"`` (AtP's estimate),
    ``"second_order"`` (the fall of the integrated quantity the curvature adds, ``-mean q / 2``),
    ``"reliability"`` and ``"flagged"`` (``[n_layers, n_heads]`` each). ``seed`` also draws
    ``"hvp"``'s probe signs."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    _check_ranking(surrogate, path, steps, L * H)
    rows = batch_size or (128 if model.W_E.device.type == "cpu" else 2048)
    alphas, weights = (np.ones(1), np.ones(1)) if path == "clean" else _nodes(steps)
    groups = [[layer] for layer in range(L)] if path == "layer" else [list(range(L))]
    n = len(tokens)
    change = torch.zeros(n, L, H, dtype=torch.float64)  # per example: m(h ablated) - m(clean)
    base = torch.zeros(n, dtype=torch.float64)
    probes = hvp_probes(n, L, H, steps, seed) if path == "hvp" else None  # [steps, n, L, H]
    curvature = torch.zeros(n, L, H, dtype=torch.float64)  # "hvp": d2m/da_h2 per example
    chunk = max(1, rows // steps)
    with eval_mode(model):
        other_of = (
            _others(model, tokens, pad_mask, method, reference, seed, rows)
            if replace is None
            else replace
        )
        for c0 in range(0, n, chunk):
            sl = slice(c0, c0 + chunk)
            part = (model, tokens[sl], pad_mask[sl], labels[sl], c0, other_of, surrogate)
            if probes is not None:
                base[sl], change[sl], curvature[sl] = _chunk_second_order(
                    *part, probes[:, sl], rows
                )
            else:
                base[sl], change[sl] = _chunk_change(*part, alphas, weights, groups)
    if probes is None:
        return _summary(surrogate, base, change, steps, path)
    return {
        **_summary(surrogate, base, change + curvature / 2, steps, path),
        **_reliability(surrogate, base, change, curvature),
    }


def _check_ranking(surrogate: Any, path: str, steps: int, n_units: int) -> None:
    """A one-line ``ValueError`` for the first bad option of :func:`rank_heads`."""
    if not callable(surrogate) and surrogate not in SURROGATES:
        raise ValueError(
            f"rank_heads: surrogate must be one of {', '.join(SURROGATES)} or a callable; got {surrogate!r}"
        )
    if path not in PATHS:
        raise ValueError(f"rank_heads: path must be one of {', '.join(PATHS)}; got {path!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"rank_heads: steps must be a positive integer, got {steps!r}")
    if path == "clean" and steps != 1:
        raise ValueError(
            f"rank_heads: path 'clean' takes the derivative at one point (steps=1), got steps={steps}"
        )
    if path == "hvp" and steps > n_units:
        raise ValueError(
            f"rank_heads: path 'hvp' deals {n_units} heads into steps probes: steps must be at most {n_units}, got {steps}"
        )


def hvp_probes(n: int, n_layers: int, n_heads: int, steps: int, seed: int) -> Tensor:
    """``path="hvp"``'s probe vectors ``[steps, n, n_layers, n_heads]``: head ``i`` (flat index,
    layer-major) belongs to probe ``i % steps``, where it holds a random sign (seeded, one per
    example: the same heads and signs whatever the batch size); 0 in the other probes."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n, n_layers * n_heads), generator=g).double() * 2 - 1
    own = torch.arange(n_layers * n_heads) % steps == torch.arange(steps)[:, None]  # [steps, LH]
    return (signs[None] * own[:, None]).view(steps, n, n_layers, n_heads)


def _clean_and_other(
    model: ProbeModel, toks: Tensor, pm: Tensor, lab: Tensor, c0: int, other_of, surrogate: Any
) -> tuple[Tensor, dict[int, Tensor]]:
    """One chunk's clean forward: the integrated quantity ``[b]`` and, per layer, what its heads'
    outputs move to (the replacement, full shape; a layer it does not list keeps its live output)."""
    L = model.cfg.n_layers
    with torch.no_grad():
        live: dict[int, Tensor] = {}
        hooks = [
            (
                HOOKS.z(layer),
                lambda x, hook, layer=layer, live=live: live.__setitem__(layer, x),
            )
            for layer in range(L)
        ]
        logits = model.run_with_hooks(toks, pm, fwd_hooks=hooks)
        base = _per_example(surrogate, logits, lab).double().cpu()
        idx = torch.arange(c0, c0 + len(toks), device=toks.device)
        now = other_of.for_chunk(idx, toks.shape[1])
        other = {
            k: (filled(now[HOOKS.z(k)], live[k]) if HOOKS.z(k) in now else live[k]).detach()
            for k in range(L)
        }
    return base, other


def _chunk_second_order(
    model: ProbeModel,
    toks: Tensor,
    pm: Tensor,
    lab: Tensor,
    c0: int,
    other_of: Replacement,
    surrogate: Any,
    probes: Tensor,
    rows: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk of examples at the clean point (``path="hvp"``): the clean value ``[b]``, each
    head's first-order change ``-g_h`` ``[b, L, H]`` and its curvature ``q_h = v_h (H v)_h`` summed
    over the ``probes`` ``[P, b, L, H]`` (one copy of the chunk each, at most ``rows`` rows a pass;
    module docstring)."""
    base, other = _clean_and_other(model, toks, pm, lab, c0, other_of, surrogate)
    per = max(1, rows // len(toks))  # probes a pass
    first, curvature = None, torch.zeros(probes.shape[1:], dtype=torch.float64)
    for p0 in range(0, len(probes), per):
        g, q = _probe_pass(model, toks, pm, lab, other, surrogate, probes[p0 : p0 + per])
        first, curvature = -g if first is None else first, curvature + q
    return base, first, curvature


def _probe_pass(
    model: ProbeModel, toks: Tensor, pm: Tensor, lab: Tensor, other: dict, surrogate: Any, probes
) -> tuple[Tensor, Tensor]:
    """``g = dm/da`` ``[b, L, H]`` at every head live, and ``sum_p v_p (H v_p)`` over ``probes``
    ``[P, b, L, H]``: one forward of ``P`` copies of the chunk, a backward and one more."""
    L, H, P = model.cfg.n_layers, model.cfg.n_heads, len(probes)
    b = len(toks)
    v = probes.reshape(P * b, L, H).to(device=toks.device, dtype=model.W_E.dtype)
    scale = torch.ones_like(v, requires_grad=True)  # every head live, in every copy

    def hook(z, hook, layer):
        o = other[layer].repeat(P, 1, 1, 1)
        return o + scale[:, layer][:, None, :, None] * (z - o)

    fwd = [(HOOKS.z(layer), partial(hook, layer=layer)) for layer in range(L)]
    # a hooked pattern makes the attention eager, and SDPA falls back to its math kernel: the fused
    # kernels (flash, Triton) have no derivative of their backward
    fwd += [(HOOKS.attn(layer, "pattern"), lambda x, hook: x) for layer in range(L)]
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        out = model.run_with_hooks(toks.repeat(P, 1), pm.repeat(P, 1), fwd_hooks=fwd)
        m = _per_example(surrogate, out, lab.repeat(P))
        (g,) = torch.autograd.grad(m.sum(), scale, create_graph=True)  # rows are independent
        (hv,) = torch.autograd.grad((g * v).sum(), scale)  # H v, per row
    g0 = g.detach().view(P, b, L, H)[0]  # the same in every copy
    curvature = (v * hv).view(P, b, L, H).sum(0)  # each head is in one probe only
    return g0.double().cpu(), curvature.double().cpu()


def _chunk_change(
    model: ProbeModel,
    toks: Tensor,
    pm: Tensor,
    lab: Tensor,
    c0: int,
    other_of: Replacement,
    surrogate: Any,
    alphas: np.ndarray,
    weights: np.ndarray,
    groups: list[list[int]],
) -> tuple[Tensor, Tensor]:
    """One chunk of examples: the integrated quantity's clean value ``[b]`` and each head's
    integrated change ``[b, L, H]`` when its output moves from live to replaced (module docstring)."""
    L, H, steps = model.cfg.n_layers, model.cfg.n_heads, len(alphas)
    b = len(toks)
    change = torch.zeros(b, L, H, dtype=torch.float64)
    base, other = _clean_and_other(model, toks, pm, lab, c0, other_of, surrogate)
    a = torch.tensor(alphas, dtype=model.W_E.dtype, device=toks.device).repeat_interleave(
        b
    )  # [steps * b]
    for group in groups:
        scale = {layer: a[:, None].expand(-1, H).clone().requires_grad_(True) for layer in group}

        def hook(z, hook, layer, scale=scale, other=other):
            o = other[layer].repeat(steps, 1, 1, 1)
            return o + scale[layer][:, None, :, None] * (z - o)

        fwd = [(HOOKS.z(layer), partial(hook, layer=layer)) for layer in group]
        out = model.run_with_hooks(toks.repeat(steps, 1), pm.repeat(steps, 1), fwd_hooks=fwd)
        m = _per_example(surrogate, out, lab.repeat(steps))
        grads = torch.autograd.grad(m.sum(), [scale[layer] for layer in group])
        w = torch.tensor(weights, dtype=torch.float64, device=toks.device).repeat_interleave(b)[
            :, None
        ]
        for layer, g in zip(group, grads):
            per = (g.double() * w).view(steps, b, H).sum(0)  # integral of dm/da over [0, 1]
            change[:, layer] = -per.cpu()
    return base, change


def _reliability(surrogate: Any, base: Tensor, first: Tensor, curvature: Tensor) -> dict[str, Any]:
    """``path="hvp"``'s extras: the first-order estimate alone (AtP, in the estimate's units), the
    second-order term ``q / 2`` and each head's reliability score ``|mean q / 2| / |mean g|`` (the
    integrated quantity's means over examples), flagged above 1 (module docstring)."""
    second = curvature.mean(0) / 2
    reliability = second.abs() / first.mean(0).abs().clamp_min(torch.finfo(torch.float64).tiny)
    return {
        "first_order": _summary(surrogate, base, first, 1, "clean")["estimate"],
        "second_order": (-second).numpy(),  # its share of the estimate's fall of the quantity
        "reliability": reliability.numpy(),
        "flagged": (reliability > 1).numpy(),
    }


def _summary(surrogate: Any, base: Tensor, change: Tensor, steps: int, path: str) -> dict[str, Any]:
    """:func:`rank_heads`' result from the clean values ``[n]`` and integrated changes ``[n, L, H]``."""
    tiebreak = -change.mean(0)  # the mean fall of the integrated quantity
    if surrogate == "accuracy":
        right = base > 0
        after = (base[:, None, None] + change) > 0
        estimate = (right[:, None, None].double() - after.double()).mean(0)
        baseline = float(right.double().mean())
    elif surrogate == "loss":
        # loss = -logprob per example: its rise (the drop ablate_heads reports) is logprob's fall
        estimate = -change.mean(0)
        baseline = float(-base.mean())
    else:
        estimate = -change.mean(0)
        baseline = float(base.mean())
    name = surrogate if isinstance(surrogate, str) else getattr(surrogate, "__name__", "custom")
    return {
        "estimate": estimate.numpy(),
        "tiebreak": tiebreak.numpy(),
        "baseline": baseline,
        "surrogate": name,
        "steps": steps,
        "path": path,
        "per_example_change": change.numpy(),
    }


__all__ = ["PATHS", "SURROGATES", "hvp_probes", "rank_heads"]

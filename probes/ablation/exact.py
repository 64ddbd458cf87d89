"""The exact engine of head ablation sweeps (:func:`probes.ablation.ablate_heads` is the entry point):
knock out one attention head (or a set of heads) at a time and measure
how much a metric suffers: the measurement behind the paper's "single-head deposit pattern"
(paper digest §6).

Three ways to remove a head, all acting on its output ``blocks.{l}.attn.hook_z``
(``[batch, pos, head, d_head]``, before ``W_O``):

- ``zero``: ``z_h = 0``. This is exactly the authors' protocol of zeroing the head's rows of the
  value projection and its value bias (``W_V[h] = 0, b_V[h] = 0`` makes ``v_h = 0``, so
  ``z_h = pattern @ v_h = 0``); the head then contributes only ``b_O`` (which it shares).
- ``mean``: ``z_h`` at position ``p`` is replaced by its mean at ``p`` over the real (non-pad)
  tokens of a reference set (the evaluated examples by default); see :func:`head_means`.
- ``resample``: ``z_h`` of example ``i`` is replaced by ``z_h`` of another example (position by
  position) from the reference set, taken from that example's clean forward. With the default
  reference (the evaluated set) the source of example ``i`` is a seeded random cyclic derangement
  of the examples, so no example is its own source; with an explicit reference each example
  draws a source uniformly (seeded). The same sources serve every head, so head-to-head
  differences are not sampling noise of the sources. Positions where the source is shorter
  than the target take the source's values at its pad positions; for length-sensitive tasks
  pass a reference of matched lengths (e.g. counterfactual pairs).

How the sweep is fast without approximating anything:

1. Examples are processed in chunks; each chunk's clean forward caches
   ``blocks.{l}.hook_resid_pre``, ``hook_resid_mid`` and ``attn.hook_z`` for the layers where
   ablations start.
2. An ablation whose earliest head is in layer ``l`` restarts the forward at layer ``l`` from
   that cache (``model(..., start_at_layer=l, residual=...)``), skipping layers ``0..l-1``, which
   an ablation in layer ``l`` cannot change. Layer ``l``'s own attention is not recomputed
   either: its input is the clean one, so the ablated ``hook_resid_mid`` is the cached clean one
   plus ``(replacement - z_h) @ W_O[h]`` for each ablated head ``h``; the forward resumes at that
   block's MLP through the model's own seam (``forward_unchecked(..., start_at="resid_mid")``).
3. Many ablations share one forward: the chunk is repeated ``k`` times along the batch axis and
   each copy removes a different head (set): through its own output change at the start layer,
   and through one hook per later layer on ``hook_z`` (for sets spanning layers) that
   replaces a different head in each copy.
4. When the model masks padding (``cfg.mask_padding``), examples are sorted by length and each
   chunk is cut to its longest real sequence. Right-hand pad columns never influence a real
   token there (pad keys are masked, positions are absolute from 0, every encoding depends on
   position only through ``[:n_pos]`` slices), so this removes work whose result is discarded.

The outcome equals a naive loop (:func:`probes.ablation.ablate_heads_naive`: one full forward per ablation, full
width, a hook writing the head's slice) within float tolerance; ``tests/test_ablation.py`` checks
this for every method and metric, with padding, causal and bidirectional attention and
``kv_source="embed"``. Ablations are always evaluated in ``eval()`` mode (no dropout); the
model's train/eval state is restored afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pe_interp.util.hardware import autocast
from pe_interp.util.modes import eval_mode
from probes.ablation.replace import for_request
from probes.ablation.request import AblationRequest
from probes.ablation.result import AblationResult
from probes.ablation.sweeps import exact_sweep
from probes.common.inputs import FiniteWatch
from probes.common.metrics import harm, paired_bootstrap


@dataclass(frozen=True)
class Exact:
    """Every unit of the sweep on every example (``engine="exact"``, the default)."""

    name = "exact"
    grid_only = False

    def run(self, req: AblationRequest) -> AblationResult:
        return exact_engine(req)


@dataclass(frozen=True)
class Naive:
    """The slow reference (:func:`probes.ablation.ablate_heads_naive`): one full forward from the
    embedding, at the full padded width, per ablation and batch of examples."""

    name = "naive"
    grid_only = False

    def run(self, req: AblationRequest) -> AblationResult:
        return exact_engine(req, naive=True)


def exact_engine(req: AblationRequest, *, naive: bool = False) -> AblationResult:
    """Every unit of ``req`` ablated on every example (``naive``: by the slow reference loop)."""
    watch = FiniteWatch()  # the logits of every forward, checked once at the end
    with eval_mode(req.model), torch.no_grad(), autocast(req.tokens.device, req.amp):
        base, vals = exact_sweep(req.sweep, for_request(req), watch, naive=naive)
    watch.check(req.who, req.amp)
    return summarise(req, base.numpy(), vals.numpy())


def summarise(req: AblationRequest, base_np: np.ndarray, vals_np: np.ndarray) -> AblationResult:
    """The result of a sweep's per-example values: means, drops and paired bootstrap intervals."""
    m, units = req.metric, req.units
    baseline = float(base_np.mean())
    low, high = paired_bootstrap(
        base_np,
        vals_np,
        higher_is_better=m.higher_is_better,
        n_bootstrap=req.n_bootstrap,
        ci=req.ci,
        seed=req.seed,
    )
    cfg = req.model.cfg
    L, H, N = cfg.n_layers, cfg.n_heads, base_np.shape[0]

    def place(x: np.ndarray, extra: tuple = ()) -> np.ndarray:
        if not req.grid:
            return np.asarray(x, dtype=np.float64)
        out = np.full((L, H) + extra, np.nan)
        for i, ((layer, h),) in enumerate(units):
            out[layer, h] = x[i]
        return out

    values = place(vals_np.mean(axis=1))
    meta = {
        "encoding": cfg.encoding_name,
        "encoding_kind": cfg.encoding_kind,
        "mask_padding": cfg.mask_padding,
        "kv_source": cfg.kv_source,
        "attention_dir": cfg.attention_dir,
        "reference": "given" if req.reference_given else "evaluated",
    }
    return AblationResult(
        baseline=baseline,
        values=values,
        drops=harm(baseline, values, m.higher_is_better),
        ci_low=place(low),
        ci_high=place(high),
        method=req.method,
        metric=m.name,
        higher_is_better=m.higher_is_better,
        n_examples=N,
        n_layers=L,
        n_heads=H,
        head_sets=None if req.grid else tuple(units),
        per_example=place(vals_np, (N,)) if req.per_example else None,
        baseline_per_example=base_np.copy() if req.per_example else None,
        n_bootstrap=req.n_bootstrap,
        ci=req.ci,
        seed=req.seed,
        meta=meta,
    )


__all__ = ["Exact", "Naive", "exact_engine", "summarise"]

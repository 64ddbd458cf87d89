"""Head ablation sweeps: knock out one attention head (or a set of heads) at a time and measure
how much a metric suffers: the measurement behind the paper's "single-head deposit pattern"
(paper digest §6).

:func:`ablate_heads` is the one entry. Its path goes down and never back:

1. :mod:`probes.ablation_inputs` checks every argument once (:func:`~probes.ablation_inputs.check_request`);
2. one engine room runs the checked request: :mod:`probes.ablation_exact` (every head on every
   example; how it is fast without approximating anything), :mod:`probes.ablation_sampled` or
   :mod:`probes.ablation_attribution` (each ending in exact ablation of the heads it ranks first);
3. below them, :mod:`probes.ablation_replace` holds what replaces a head (``zero``, ``mean``,
   ``resample``) and :mod:`probes.ablation_result` the result, which saves and loads itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from torch import Tensor

from probes.ablation_attribution import attribution_engine
from probes.ablation_exact import exact_engine
from probes.ablation_inputs import ENGINES, check_request, default_batch_size, keep_only
from probes.ablation_replace import head_means
from probes.ablation_result import METHODS, AblationResult, Head
from probes.ablation_sampled import sampled_engine
from probes.metrics import Metric, MetricFn, resample_sources
from probes.options import AblationMethod, Engine, IntegrationPath


def ablate_heads(
    model,
    tokens: Tensor,
    labels: Tensor,
    *,
    pad_mask: Tensor | None = None,
    method: AblationMethod = "zero",
    metric: str | MetricFn | Metric = "accuracy",
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    head_sets: Iterable[Iterable[Head]] | None = None,
    reference: Any = None,
    per_example: bool = False,
    n_bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
    higher_is_better: bool | None = None,
    engine: Engine = "exact",
    verify_top: int = 3,
    steps: int = 4,
    path: IntegrationPath = "joint",
    amp: bool = False,
    sample: float = 0.2,
) -> AblationResult:
    """Ablate attention heads one at a time (or in sets) and measure ``metric`` each time.

    Args:
        model: a :class:`~pe_interp.HookedPETransformer` (any device; inputs follow it).
        tokens, labels, pad_mask: the evaluation examples (``pad_mask`` True at real tokens;
            default ``tokens != cfg.pad_id``).
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (module docstring).
        metric: ``"accuracy"``, ``"loss"`` (cross-entropy; lower is better), ``"logit"``
            (true-class logit), or ``metric(logits, labels) -> Tensor[batch]`` (higher is better
            unless ``higher_is_better=False``).
        layers, heads: the grid to sweep (default: every layer, every head); the rest is NaN.
        head_sets: instead of the grid, a list of sets of ``(layer, head)`` each ablated
            together (see :func:`keep_only`); the result then has one entry per set.
        reference: for ``mean``/``resample``, where replacement activations come from: a token
            tensor, a ``(tokens, pad_mask)`` pair or a ``Batch``; default the evaluated
            examples. For ``resample`` it must have the evaluated tokens' padded length.
        per_example: keep the per-example metric values.
        n_bootstrap, ci, seed: the paired percentile bootstrap of the drops (0 disables it);
            ``seed`` also seeds the resample sources (separate generators).
        batch_size: most rows per forward (examples x stacked ablations); bounds memory.
            Default :func:`default_batch_size` (128 on CPU, 2048 on GPU).
        progress: show a tqdm bar.
        amp: run the forwards under bf16 autocast where the device runs bf16 natively
            (:mod:`pe_interp.hardware`); default fp32, exact. In bf16 every drop is within 2
            accuracy points of fp32 and the deposit verdicts are the same (``benchmarks/bf16_parity.py``).
        engine: ``"exact"`` ablates every head of the grid. ``"sampled"`` ablates every head of
            the grid exactly on a seeded random share ``sample`` of the examples, then the
            ``verify_top`` heads with the largest drops there on every example
            (:func:`probes.ablation_sampled.sampled_engine`): a whole grid, the verified heads exact, the
            others unbiased estimates with intervals over the sample; ``meta["verification"]``
            holds the verified heads' sampled against exact drops. On trained models it ranks
            heads like the exact grid to within the grid's own sampling noise
            (``benchmarks/head_ranking.py``). ``"attribution"`` ranks every head
            of the grid by integrated gradients along the ablation path
            (:func:`probes.circuits.heads.rank_heads`: each head's output moved from its live
            value to the ablated one, ``steps`` Gauss-Legendre nodes, along ``path``
            ``"joint"`` or ``"layer"``), in the units of ``metric`` (accuracy: each example's
            margin change, counted as a flip where it crosses zero; loss; logit; a callable
            integrated itself), then ablates the ``verify_top`` heads estimated to hurt most
            exactly. The result is a grid with those heads' exact values and NaN elsewhere;
            ``meta`` holds the estimates (``"attribution"``), the stand-in, the verified heads
            and ``"verification"``: their estimates against their exact drops (largest error,
            whether the estimated top of them is the exact top, Spearman's rho from 3 heads).
            Its top head is exact among the verified; :func:`probes.find_deposits` refuses the
            partial grid (a deposit verdict needs every head of a layer).
        sample: the share of the examples ``engine="sampled"`` screens every head on.

    Returns:
        An :class:`AblationResult`; its ``drops`` are positive when an ablation hurt.
    """
    req = check_request(
        model,
        tokens,
        labels,
        pad_mask=pad_mask,
        method=method,
        metric=metric,
        layers=layers,
        heads=heads,
        head_sets=head_sets,
        reference=reference,
        per_example=per_example,
        n_bootstrap=n_bootstrap,
        ci=ci,
        seed=seed,
        batch_size=batch_size,
        progress=progress,
        higher_is_better=higher_is_better,
        amp=amp,
        engine=engine,
        verify_top=verify_top,
        sample=sample,
        steps=steps,
        path=path,
    )
    if engine == "sampled":
        return sampled_engine(req, sample=sample, verify_top=verify_top)
    if engine == "attribution":
        return attribution_engine(
            dataclasses.replace(req, amp=False), verify_top=verify_top, steps=steps, path=path
        )
    return exact_engine(req)


def ablate_heads_naive(
    model,
    tokens: Tensor,
    labels: Tensor,
    *,
    pad_mask: Tensor | None = None,
    method: AblationMethod = "zero",
    metric: str | MetricFn | Metric = "accuracy",
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    head_sets: Iterable[Iterable[Head]] | None = None,
    reference: Any = None,
    per_example: bool = False,
    n_bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
    higher_is_better: bool | None = None,
    amp: bool = False,
) -> AblationResult:
    """The slow reference for :func:`ablate_heads` (same arguments, same result): one full
    forward from the embedding, at the full padded width, per ablation and batch of examples,
    with a hook that overwrites the head's slice of ``hook_z``. For tests and benchmarks."""
    req = check_request(
        model,
        tokens,
        labels,
        pad_mask=pad_mask,
        method=method,
        metric=metric,
        layers=layers,
        heads=heads,
        head_sets=head_sets,
        reference=reference,
        per_example=per_example,
        n_bootstrap=n_bootstrap,
        ci=ci,
        seed=seed,
        batch_size=batch_size,
        progress=progress,
        higher_is_better=higher_is_better,
        amp=amp,
        who="ablate_heads_naive",
    )
    return exact_engine(req, naive=True)


__all__ = [
    "ENGINES",
    "METHODS",
    "AblationResult",
    "Head",
    "ablate_heads",
    "ablate_heads_naive",
    "default_batch_size",
    "head_means",
    "keep_only",
    "resample_sources",
]

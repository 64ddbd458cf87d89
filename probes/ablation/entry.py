"""The one entry of head ablation: :func:`ablate_heads` (and its slow reference
:func:`ablate_heads_naive`). Its path goes down and never back: the one input check
(:func:`probes.ablation.plan.check_request`), then the engine the request names runs it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from probes.ablation.engines import AblationEngine
from probes.ablation.exact import Naive
from probes.ablation.plan import check_request
from probes.ablation.result import AblationResult, Head
from probes.common.metrics import Metric, MetricFn
from probes.common.options import AblationMethod, Engine

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def ablate_heads(
    model: ProbeModel,
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
    engine: Engine | AblationEngine = "exact",
    amp: bool = False,
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
            (:mod:`pe_interp.util.hardware`); default fp32, exact. In bf16 every drop is within 2
            accuracy points of fp32 and the deposit verdicts are the same (``benchmarks/bf16_parity.py``).
        engine: how the grid is covered (:mod:`probes.ablation.engines`): an engine object
            that holds its own options, or a string for one with its defaults: ``"exact"``
            (every head), ``"sampled"`` (the grid on a share of the examples, the top heads
            verified exactly) or ``"attribution"`` (integrated gradients along the ablation path,
            the top heads verified exactly; a partial grid, NaN elsewhere).

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
    )
    return req.engine.run(req)


def ablate_heads_naive(
    model: ProbeModel,
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
        engine=Naive(),
    )
    return req.engine.run(req)


__all__ = ["ablate_heads", "ablate_heads_naive"]

"""The one input check of a head-ablation sweep (:func:`probes.ablation.ablate_heads`).

:func:`check_request` checks every argument once, before any work, and returns an
:class:`AblationRequest`: the examples on the model's device, the units to ablate, the resolved
metric, the engine (:func:`probes.ablation.engines.as_engine`) and defaults. The engines
(:mod:`probes.ablation.exact`, :mod:`probes.ablation.sampled`, :mod:`probes.ablation.attribution`)
take a request and check nothing again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from probes.ablation.engines import check_engine
from probes.ablation.request import AblationRequest, default_batch_size
from probes.ablation.result import METHODS, Head
from probes.common.inputs import (
    as_probe_model,
    check_count,
    check_examples,
    check_finite_model,
    check_head,
    check_layer,
    check_layers,
)
from probes.common.metrics import resolve_metric

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


def keep_only(model_or_n_heads: ProbeModel | int, layer: int, head: int) -> frozenset[Head]:
    """The head set that ablates every head of ``layer`` except ``head`` ("keep only one").

    Ablating it measures how much of the layer's contribution ``head`` carries alone.
    ``model_or_n_heads`` is a model (its ``cfg.n_heads`` is used) or the number of heads."""
    n_heads = (
        model_or_n_heads if isinstance(model_or_n_heads, int) else model_or_n_heads.cfg.n_heads
    )
    check_head(n_heads, head, "keep_only")
    if not isinstance(model_or_n_heads, int):
        check_layer(model_or_n_heads, layer, "keep_only")
    return frozenset((layer, h) for h in range(n_heads) if h != head)


def as_inputs(ref: Any) -> tuple[Tensor, Tensor | None]:
    """``(tokens, pad_mask)`` of a token tensor, a ``(tokens, pad_mask)`` pair or a ``Batch``."""
    if isinstance(ref, Tensor):
        return ref, None
    if isinstance(ref, tuple | list) and len(ref) == 2:
        return ref[0], ref[1]
    if hasattr(ref, "tokens"):
        return ref.tokens, getattr(ref, "pad_mask", None)
    raise ValueError("reference must be a token tensor, a (tokens, pad_mask) pair or a Batch")


def check_reference(model: ProbeModel, reference: Any, who: str) -> tuple[Tensor, Tensor]:
    """A reference set's ``(tokens, pad_mask)``, checked like the evaluated examples."""
    tokens, pad_mask = as_inputs(reference)
    tokens, _, pad_mask = check_examples(
        model,
        tokens,
        None,
        pad_mask,
        who=who,
        what="reference",
        mask_name="the reference's pad_mask",
    )
    return tokens, pad_mask


def units_of(
    model: ProbeModel, layers, heads, head_sets, who: str = "ablate_heads"
) -> tuple[list[tuple[Head, ...]], bool]:
    """The ablations of a sweep: one per head of the layers x heads grid, or one per head set."""
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def check(layer: int, head: int) -> Head:
        return check_layer(L, layer, who), check_head(H, head, who)

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
    ls = list(range(L)) if layers is None else check_layers(L, layers, who)
    hs = list(range(H)) if heads is None else [check(0, h)[1] for h in heads]
    if not ls or not hs:
        raise ValueError("nothing to ablate: layers and heads must be non-empty")
    return [((layer, h),) for layer in sorted(set(ls)) for h in sorted(set(hs))], True


def check_request(
    model: ProbeModel,
    tokens,
    labels,
    *,
    pad_mask=None,
    method="zero",
    metric="accuracy",
    layers=None,
    heads=None,
    head_sets: Iterable[Iterable[Head]] | None = None,
    reference=None,
    per_example=False,
    n_bootstrap=1000,
    ci=0.95,
    seed=0,
    batch_size=None,
    progress=False,
    higher_is_better=None,
    amp=False,
    who="ablate_heads",
    engine: Any = "exact",
) -> AblationRequest:
    """Every check of a sweep, in one place: a one-line ``ValueError`` for the first bad argument.
    A raw TransformerLens bridge is wrapped here (:func:`probes.common.inputs.as_probe_model`)."""
    model = as_probe_model(model, who)
    engine = check_engine(engine, head_sets is not None)
    if method not in METHODS:
        raise ValueError(
            f"unknown method {method!r}; expected one of {', '.join(map(repr, METHODS))}"
        )
    batch_size = default_batch_size(model) if batch_size is None else batch_size
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")
    m = resolve_metric(metric, higher_is_better)
    units, grid = units_of(model, layers, heads, head_sets, who)
    check_finite_model(model, who)
    n_bootstrap = check_count(n_bootstrap, "n_bootstrap", 0, who)
    tokens, labels, pad_mask = check_examples(model, tokens, labels, pad_mask, who=who)
    if tokens.shape[0] == 0:
        raise ValueError(f"{who}: no examples to evaluate")
    ref = None if reference is None else check_reference(model, reference, who)
    if method == "mean" and ref is None and tokens.shape[0] < 2:
        raise ValueError(
            f"{who}: mean ablation needs at least 2 examples (or a reference set): over one "
            "example the mean output is that example's own, and every drop would be exactly 0"
        )
    if method == "resample" and ref is not None and ref[0].shape[1] != tokens.shape[1]:
        raise ValueError(
            "resample ablation: the reference must have the padded length of the evaluated "
            f"tokens ({tokens.shape[1]}), got {ref[0].shape[1]}"
        )
    return AblationRequest(
        model,
        tokens,
        labels,
        pad_mask,
        units,
        grid,
        method,
        m,
        ref,
        bool(per_example),
        n_bootstrap,
        float(ci),
        int(seed),
        batch_size,
        bool(progress),
        bool(amp),
        who,
        reference is not None,
        engine,
    )


__all__ = [
    "AblationRequest",
    "as_inputs",
    "check_request",
    "default_batch_size",
    "keep_only",
    "units_of",
]

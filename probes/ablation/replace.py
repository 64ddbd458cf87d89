"""What replaces an ablated head in :func:`probes.ablation.ablate_heads`, from its checked request:
the request's examples, reference, seed and batch size handed to the one replacement seam
(:mod:`probes.common.replace`), and :func:`head_means`, the mean-ablation values as a public function."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from pe_interp.models.protocol import HOOKS, ProbeModel
from probes.ablation.request import AblationRequest, default_batch_size
from probes.common.inputs import check_examples, check_layers, takes_probe_model
from probes.common.replace import Replacement, position_means, replacement


def for_request(req: AblationRequest) -> Replacement:
    """The replacement ``req.method`` of a checked sweep, at ``hook_z`` of the layers its units
    touch."""
    layers = sorted({layer for unit in req.units for layer, _ in unit})
    return replacement(
        req.model,
        req.method,
        [HOOKS.z(layer) for layer in layers],
        req.tokens,
        req.pad_mask,
        reference=req.reference,
        seed=req.seed,
        batch_size=req.batch_size,
    )


@takes_probe_model
def head_means(
    model: ProbeModel,
    tokens: Tensor,
    pad_mask: Tensor | None = None,
    *,
    layers: Iterable[int] | None = None,
    width: int | None = None,
    batch_size: int | None = None,
) -> dict[int, Tensor]:
    """Mean of ``blocks.{l}.attn.hook_z`` per position over the real tokens of ``tokens``.

    Returns ``{layer: [width, n_heads, d_head]}`` (``width`` defaults to the padded length of
    ``tokens``). Position ``p`` averages the examples whose position ``p`` is a real token;
    positions that are real in no example (beyond the reference's lengths) get the mean over
    all real tokens of all positions. With ``cfg.mask_padding=False`` every position counts as
    a token, as the model sees it (:func:`probes.common.replace.position_means`).
    """
    tokens, _, pad_mask = check_examples(model, tokens, None, pad_mask)
    layers = sorted(
        set(
            range(model.cfg.n_layers)
            if layers is None
            else check_layers(model, layers, "head_means")
        )
    )
    if not layers:
        raise ValueError("head_means: layers is empty; pass None for every layer")
    means = position_means(
        model,
        tokens,
        pad_mask,
        [HOOKS.z(layer) for layer in layers],
        default_batch_size(model) if batch_size is None else batch_size,
        width=width,
        stop_at_layer=max(layers) + 1,
    )
    return {layer: means[HOOKS.z(layer)] for layer in layers}


__all__ = ["for_request", "head_means"]

"""Batched activation patching with per-example values and bootstrap confidence intervals.

:func:`patch` computes the same numbers as TransformerLens' ``get_act_patch_*`` functions
(``transformer_lens.patching``) on a :class:`~pe_interp.HookedPETransformer`, with the same
output shapes, but much faster:

- the source run (clean, by default) and the receiving run (corrupt) are each cached **once**;
- a patched run **starts at the patched layer** from the receiving run's cached
  ``blocks.{l}.hook_resid_pre`` (``model(..., start_at_layer=l, residual=...)``), so layers before
  the patch are never recomputed. Patches of a head's output (``z``), of ``attn_out`` and of
  ``mlp_out`` start even later: the patched layer's attention (and, for ``mlp_out``, its MLP) is
  not recomputed at all, only ``W_O`` applied to the mixed ``z`` (this is exactly what the layer
  computes from its ``hook_z``);
- many patch cells run in **one forward**: the batch is expanded to ``[cells * examples]`` rows
  and each cell's rows get their own patch, written as one ``torch.where`` against a boolean
  cell mask.

Patched forwards run under ``torch.no_grad`` (TransformerLens builds an autograd graph each time).

Sites and the TransformerLens function each one matches (``by_position`` False / True):

============  ============================================  ==========================================
site          all positions                                 by position
============  ============================================  ==========================================
``z``         ``get_act_patch_attn_head_out_all_pos``        ``get_act_patch_attn_head_out_by_pos``
              ``[layer, head]``                              ``[layer, pos, head]``
``q/k/v``     ``get_act_patch_attn_head_{q,k,v}_all_pos``    ``get_act_patch_attn_head_{q,k,v}_by_pos``
``pattern``   ``get_act_patch_attn_head_pattern_all_pos``    ``get_act_patch_attn_head_pattern_by_pos``
              ``[layer, head]``                              ``[layer, head, dest_pos]``
``resid_pre`` (``[layer]``, no TL equivalent)               ``get_act_patch_resid_pre`` ``[layer, pos]``
``attn_out``  (``[layer]``, no TL equivalent)               ``get_act_patch_attn_out`` ``[layer, pos]``
``mlp_out``   (``[layer]``, no TL equivalent)               ``get_act_patch_mlp_out`` ``[layer, pos]``
============  ============================================  ==========================================

``by_position=None`` (the default) picks what TransformerLens does for the site: all positions for
the head sites, by position for the residual-stream sites.

Metric. With ``metric=None`` the metric is the logit difference between the clean and the corrupt
label, normalised so that the unpatched clean run scores 1 and the unpatched corrupt run 0:

    value = mean_i(ld_patched_i - ld_corrupt_i) / mean_i(ld_clean_i - ld_corrupt_i)

(a ratio of batch means, which is what a scalar TransformerLens metric of the batch-mean logit
difference gives, and which stays finite when one example's clean and corrupt logit differences
happen to coincide). ``per_example[..., i] = (ld_patched_i - ld_corrupt_i) / mean_j(ld_clean_j -
ld_corrupt_j)`` so that ``per_example.mean(-1) == values``; the bootstrap resamples examples and
recomputes the ratio (numerator and denominator) on each resample.

A custom ``metric(logits [n_examples, n_classes])`` follows TransformerLens' convention: it gets
the logits of the whole patched batch and returns a scalar, or a ``[n_examples]`` tensor (then
``values`` is its mean and ``per_example``/CIs are kept). With a scalar metric ``per_example`` and
the CIs are ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pe_interp.util.hardware import autocast
from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    FiniteWatch,
    takes_probe_model,
)
from probes.common.progress import SweepProgress
from probes.patching.cells import (
    BLOCK_SITES,
    HEAD_SITES,
    SITES,
    Patcher,
    cell_layout,
    first_block,
    hook_name,
)
from probes.patching.checks import DIRECTIONS, PatchInputs, check_patch
from probes.patching.metric import bootstrap_ratio_ci, logit_diff, normalized_logit_diff_metric
from probes.patching.result import RESULT_KIND, PatchResult
from probes.patching.values import custom_result, normalised_result

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


@takes_probe_model
def patch(
    model: ProbeModel,
    clean_tokens: Tensor,
    corrupt_tokens: Tensor,
    *,
    site: str = "z",
    by_position: bool | None = None,
    metric: Callable[[Tensor], Tensor] | None = None,
    clean_labels: Tensor | None = None,
    corrupt_labels: Tensor | None = None,
    pad_mask: Tensor | None = None,
    direction: str = "clean_to_corrupt",
    layers: Sequence[int] | None = None,
    batch_size: int = 256,
    n_bootstrap: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
    amp: bool = False,
    progress: bool = False,
) -> PatchResult:
    """Activation patching of ``site`` over every layer (or ``layers``) and cell.

    Args:
        model: a :class:`~pe_interp.HookedPETransformer` (set to eval mode for the call, then
            restored).
        clean_tokens, corrupt_tokens: ``[n, pos]``; row i of each forms a pair.
        site: one of ``z q k v pattern resid_pre attn_out mlp_out`` (``k``, ``v`` under grouped
            key/value heads: one cell per key/value head, which its group of query heads reads).
        by_position: one cell per position (and head); None: TransformerLens' default for the site.
        metric: ``metric(logits [n, n_classes]) -> scalar | [n]``; None: normalised logit
            difference between ``clean_labels`` and ``corrupt_labels`` (required then).
        pad_mask: ``[n, pos]`` bool (True at real tokens), shared by both runs (pairs are
            aligned); None: each run uses the model's default (``tokens != pad_id``).
        direction: ``"clean_to_corrupt"`` runs the corrupt input and patches in clean activations
            (TransformerLens' convention; "how much does this activation restore?");
            ``"corrupt_to_clean"`` runs the clean input and patches in corrupt activations ("how
            much does corrupting it destroy?"). The default metric is still 1 at the clean run and 0
            at the corrupt run.
        layers: which layers to patch (``values``' first axis follows this order).
        batch_size: rows per forward (cells x examples). With a custom metric every forward holds
            all ``n`` examples of a cell (so the metric sees the whole batch, as in TL).
        n_bootstrap: bootstrap resamples for the CIs (0: none).
        amp: bf16 autocast where the device runs bf16 natively (:mod:`pe_interp.util.hardware`);
            default fp32, exact.
        progress: a bar with an ETA, advanced by each forward's cost (the layers it runs).
    """
    inp = check_patch(
        model,
        clean_tokens,
        corrupt_tokens,
        site=site,
        by_position=by_position,
        default_metric=metric is None,
        clean_labels=clean_labels,
        corrupt_labels=corrupt_labels,
        pad_mask=pad_mask,
        direction=direction,
        layers=layers,
        batch_size=batch_size,
        n_bootstrap=n_bootstrap,
    )
    cells, src_logits, recv_logits = _patch_cells(model, inp, metric, amp, progress)
    clean_logits, corrupt_logits = (
        (src_logits, recv_logits) if direction == "clean_to_corrupt" else (recv_logits, src_logits)
    )
    if inp.default_metric:
        return normalised_result(
            inp, cells, clean_logits, corrupt_logits, n_bootstrap, seed, ci_level
        )
    return custom_result(
        inp, cells, metric, clean_logits, corrupt_logits, n_bootstrap, seed, ci_level
    )


def _patch_cells(
    model: ProbeModel,
    inp: PatchInputs,
    metric: Callable[[Tensor], Tensor] | None,
    amp: bool,
    progress: bool,
) -> tuple[Any, Tensor, Tensor]:
    """Every cell of every layer patched (module docstring): the default metric's patched logit
    differences ``[layers, cells, n]``, or the custom metric's values per layer and cell; and the
    source and receiving runs' logits."""
    site, layers, masks, chunk, group = inp.site, inp.layers, inp.masks, inp.chunk, inp.group
    src_tokens, recv_tokens, pad_mask, n = inp.src_tokens, inp.recv_tokens, inp.pad_mask, inp.n
    clean_labels, corrupt_labels, default_metric = (
        inp.clean_labels,
        inp.corrupt_labels,
        inp.default_metric,
    )
    cfg, device, n_cells = model.cfg, masks.device, masks.shape[0]
    watch = FiniteWatch()  # every logit of the call, checked once after the loop
    with eval_mode(model), torch.no_grad(), autocast(device, amp):
        ld_cells = None  # default metric: [len(layers), n_cells, n] patched logit differences
        custom_vals: list[list[Tensor]] = [[None] * n_cells for _ in layers]  # type: ignore[list-item]
        src_logits_all, recv_logits_all = [], []
        if default_metric:
            ld_cells = torch.empty(len(layers), n_cells, n, dtype=torch.float64, device=device)
        L = cfg.n_layers
        bar = SweepProgress(
            progress,
            f"patch ({site})",
            n * (2 * L + n_cells * sum(L - first_block(model, site, layer) for layer in layers)),
            n_cells * len(layers),
            n,
            unit="patches",
        )
        for start in range(0, n, chunk):
            rows = slice(start, min(n, start + chunk))
            m = None if pad_mask is None else pad_mask[rows]
            patcher = Patcher(model, site, layers, src_tokens[rows], recv_tokens[rows], m, m)
            bar.update(2 * L * (rows.stop - rows.start))
            src_logits_all.append(patcher.src_logits)
            recv_logits_all.append(patcher.recv_logits)
            k = rows.stop - rows.start
            for li, layer in enumerate(layers):
                for c0 in range(0, n_cells, group):
                    c1 = min(n_cells, c0 + group)
                    logits = watch.see(patcher.run(layer, masks[c0:c1]).reshape(c1 - c0, k, -1))
                    if default_metric:
                        good = clean_labels[rows].expand(c1 - c0, k)
                        bad = corrupt_labels[rows].expand(c1 - c0, k)
                        ld_cells[li, c0:c1, rows] = logit_diff(logits, good, bad).double()
                    else:
                        for c in range(c1 - c0):
                            custom_vals[li][c0 + c] = torch.as_tensor(metric(logits[c])).detach()
                    ran = L - first_block(model, site, layer)
                    bar.update((c1 - c0) * k * ran, (c1 - c0) * k)
        bar.close()
        src_logits = watch.see(torch.cat(src_logits_all))
        recv_logits = watch.see(torch.cat(recv_logits_all))
    watch.check("patch", amp)
    return (ld_cells if default_metric else custom_vals), src_logits, recv_logits


__all__ = [
    "BLOCK_SITES",
    "RESULT_KIND",
    "DIRECTIONS",
    "HEAD_SITES",
    "SITES",
    "PatchResult",
    "bootstrap_ratio_ci",
    "cell_layout",
    "hook_name",
    "logit_diff",
    "normalized_logit_diff_metric",
    "patch",
]

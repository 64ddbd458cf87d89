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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pe_interp.util.hardware import autocast
from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    FiniteWatch,
    check_count,
    check_examples,
    check_finite_model,
    check_layers,
    check_token_tensor,
    takes_probe_model,
)
from probes.common.progress import SweepProgress
from probes.patching.cells import (
    BLOCK_SITES,
    HEAD_SITES,
    SITES,
    _Patcher,
    cell_layout,
    first_block,
    hook_name,
)
from probes.patching.metric import bootstrap_ratio_ci, logit_diff, normalized_logit_diff_metric
from probes.patching.result import RESULT_KIND, PatchResult

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

DIRECTIONS = ("clean_to_corrupt", "corrupt_to_clean")
DEFAULT_METRIC_NAME = "normalized_logit_diff"


def _check_tokens(name: str, t: Tensor) -> Tensor:
    try:
        check_token_tensor(t, name)
    except ValueError as err:
        raise ValueError(f"patch: {err}") from None
    if t.ndim != 2:
        raise ValueError(
            f"patch: {name} must be a [batch, pos] integer tensor, got shape {tuple(t.shape)}"
        )
    return t


def _check_pairs_differ(
    model: ProbeModel, clean: Tensor, corrupt: Tensor, good: Tensor, bad: Tensor, pad_mask: Tensor
) -> None:
    """Before any patching: the default metric divides by the clean run's logit difference minus
    the corrupt run's. Refuse, in one line, labels that no pair changes (no forward) and pairs
    whose two runs give the same mean difference (two forwards)."""
    if bool((good == bad).all()):
        raise ValueError(
            "patch: every pair has the same clean and corrupt label, so the logit difference is 0 "
            "in both runs and the normalised metric is undefined; use counterfactuals that change "
            "the answer, or pass metric="
        )
    watch = FiniteWatch()
    with eval_mode(model), torch.no_grad():
        ld = [
            logit_diff(
                watch.see(model.forward_unchecked(*model.check_inputs(t, pad_mask))), good, bad
            )
            for t in (clean, corrupt)
        ]
        gap = float((ld[0].double() - ld[1].double()).mean())
    watch.check("patch")
    if not math.isfinite(gap) or abs(gap) < 1e-12:
        raise ValueError(
            f"patch: the clean and corrupt runs have the same mean logit difference ({gap:.2g}), so "
            "the normalised metric is undefined; pass metric= or use other pairs"
        )


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
    inp = _check_patch(
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
        return _normalised_result(
            inp, cells, clean_logits, corrupt_logits, n_bootstrap, seed, ci_level
        )
    return _custom_result(
        inp, cells, metric, clean_logits, corrupt_logits, n_bootstrap, seed, ci_level
    )


@dataclass(frozen=True, eq=False)
class _PatchInputs:
    """:func:`patch`'s arguments, checked: the pairs in source and receiving order, and the cells."""

    site: str
    by_position: bool
    direction: str
    default_metric: bool
    layers: tuple[int, ...]
    clean_labels: Tensor | None
    corrupt_labels: Tensor | None
    src_tokens: Tensor
    recv_tokens: Tensor
    pad_mask: Tensor | None
    masks: Tensor  # [cells, ...] one boolean mask per patch cell
    cell_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    chunk: int  # examples per forward
    group: int  # cells per forward

    @property
    def n(self) -> int:
        return self.src_tokens.shape[0]


def _check_patch(
    model: ProbeModel,
    clean_tokens: Tensor,
    corrupt_tokens: Tensor,
    *,
    site: str,
    by_position: bool | None,
    default_metric: bool,
    clean_labels: Tensor | None,
    corrupt_labels: Tensor | None,
    pad_mask: Tensor | None,
    direction: str,
    layers: Sequence[int] | None,
    batch_size: int,
    n_bootstrap: int,
) -> _PatchInputs:
    """Every check of :func:`patch`, in order, and the cells; the only forwards are the pairs'
    own check (:func:`_check_pairs_differ`), before any patching."""
    check_finite_model(model, "patch")
    if site not in SITES:
        raise ValueError(f"patch: unknown site {site!r}; expected one of {', '.join(SITES)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"patch: direction must be one of {DIRECTIONS}, got {direction!r}")
    clean_tokens = _check_tokens("clean_tokens", clean_tokens)
    corrupt_tokens = _check_tokens("corrupt_tokens", corrupt_tokens)
    if clean_tokens.shape != corrupt_tokens.shape:
        raise ValueError(
            f"patch: clean and corrupt tokens must have the same shape, got {tuple(clean_tokens.shape)} "
            f"and {tuple(corrupt_tokens.shape)}"
        )
    n, n_pos = clean_tokens.shape
    if n == 0:
        raise ValueError("patch: no examples")
    if pad_mask is not None and (
        pad_mask.shape != clean_tokens.shape or pad_mask.dtype != torch.bool
    ):
        raise ValueError(
            f"patch: pad_mask must be a bool tensor shaped {tuple(clean_tokens.shape)}"
        )
    check_count(batch_size, "batch_size", 1, "patch")
    check_count(n_bootstrap, "n_bootstrap", 0, "patch")
    cfg = model.cfg
    if layers is None:
        layers = tuple(range(cfg.n_layers))
    layers = tuple(check_layers(model, layers, "patch"))
    if not layers:
        raise ValueError(
            f"patch: layers must be a non-empty subset of 0..{cfg.n_layers - 1}, got {layers}"
        )
    if site == "mlp_out" and not cfg.d_mlp:
        raise ValueError("patch: site 'mlp_out' needs a model with MLPs (d_mlp > 0)")
    if by_position is None:
        by_position = site in BLOCK_SITES
    device = model.W_E.device
    if default_metric and (clean_labels is None or corrupt_labels is None):
        raise ValueError(
            "patch: the default metric needs clean_labels and corrupt_labels (or pass metric=)"
        )
    # both runs share pad_mask (pairs are aligned): it must fit the clean and the corrupt tokens
    clean_tokens, clean_labels, mask = check_examples(
        model,
        clean_tokens,
        clean_labels,
        pad_mask,
        who="patch",
        what="clean_tokens",
        label_name="clean_labels",
    )
    corrupt_tokens, corrupt_labels, _ = check_examples(
        model,
        corrupt_tokens,
        corrupt_labels,
        pad_mask,
        who="patch",
        what="corrupt_tokens",
        label_name="corrupt_labels",
    )
    pad_mask = None if pad_mask is None else mask
    if default_metric:
        _check_pairs_differ(model, clean_tokens, corrupt_tokens, clean_labels, corrupt_labels, mask)
    if direction == "clean_to_corrupt":
        src_tokens, recv_tokens = clean_tokens, corrupt_tokens
    else:
        src_tokens, recv_tokens = corrupt_tokens, clean_tokens

    heads = cfg.n_heads
    if site in ("k", "v"):
        heads = model.kv_layout.n_kv_heads  # grouped heads: hook_k/hook_v carry those heads only
    masks, cell_shape, axis_names = cell_layout(site, by_position, n_pos, heads)
    masks = masks.to(device)
    chunk = n if not default_metric else min(n, batch_size)
    group = max(1, batch_size // chunk)
    return _PatchInputs(
        site,
        bool(by_position),
        direction,
        default_metric,
        layers,
        clean_labels,
        corrupt_labels,
        src_tokens,
        recv_tokens,
        pad_mask,
        masks,
        cell_shape,
        axis_names,
        chunk,
        group,
    )


def _patch_cells(
    model: ProbeModel,
    inp: _PatchInputs,
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
            patcher = _Patcher(model, site, layers, src_tokens[rows], recv_tokens[rows], m, m)
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


def _patch_result(
    inp: _PatchInputs, values, per_example, ci_low, ci_high, **kw: Any
) -> PatchResult:
    return PatchResult(
        values=values,
        per_example=per_example,
        ci_low=ci_low,
        ci_high=ci_high,
        site=inp.site,
        by_position=inp.by_position,
        direction=inp.direction,
        layers=inp.layers,
        axis_names=inp.axis_names,
        n_examples=inp.n,
        **kw,
    )


def _normalised_result(
    inp: _PatchInputs,
    ld_cells: Tensor,
    clean_logits: Tensor,
    corrupt_logits: Tensor,
    n_bootstrap: int,
    seed: int,
    ci_level: float,
) -> PatchResult:
    """The default metric: each cell's patched logit difference, 1 at the clean run and 0 at the
    corrupt one, per example and with paired bootstrap intervals of the ratio."""
    grid, n = (len(inp.layers), *inp.cell_shape), inp.n
    clean_labels, corrupt_labels = inp.clean_labels, inp.corrupt_labels
    ci_low = ci_high = None
    ld_clean = logit_diff(clean_logits, clean_labels, corrupt_labels).double()
    ld_corrupt = logit_diff(corrupt_logits, clean_labels, corrupt_labels).double()
    denom = (ld_clean - ld_corrupt).mean()
    if not torch.isfinite(denom) or denom.abs() < 1e-12:
        raise ValueError(
            "patch: the clean and corrupt runs have the same mean logit difference, so the "
            "normalised metric is undefined; pass metric= or use other pairs"
        )
    numer = ld_cells - ld_corrupt  # [L, cells, n]
    per_example = (numer / denom).reshape(*grid, n)
    values = per_example.mean(-1)
    if n_bootstrap > 0:
        ci_low, ci_high = bootstrap_ratio_ci(
            numer, ld_clean - ld_corrupt, n_bootstrap, seed, ci_level
        )
        ci_low, ci_high = ci_low.reshape(grid), ci_high.reshape(grid)
    extra = {
        "logit_diff_clean": float(ld_clean.mean()),
        "logit_diff_corrupt": float(ld_corrupt.mean()),
        # how well the pairs separate the labels: the normaliser over its per-example spread
        "denominator_z": float(denom / ((ld_clean - ld_corrupt).std() / math.sqrt(n)))
        if n > 1 and float((ld_clean - ld_corrupt).std()) > 0
        else None,
    }
    dtype = clean_logits.dtype
    values, per_example = values.to(dtype), per_example.to(dtype)
    if ci_low is not None:
        ci_low, ci_high = ci_low.to(dtype), ci_high.to(dtype)
    return _patch_result(
        inp,
        values,
        per_example,
        ci_low,
        ci_high,
        metric_name=DEFAULT_METRIC_NAME,
        clean_value=1.0,
        corrupt_value=0.0,
        n_bootstrap=n_bootstrap if ci_low is not None else 0,
        ci_level=ci_level,
        extra=extra,
    )


def _custom_result(
    inp: _PatchInputs,
    custom_vals: list[list[Tensor]],
    metric: Callable[[Tensor], Tensor],
    clean_logits: Tensor,
    corrupt_logits: Tensor,
    n_bootstrap: int,
    seed: int,
    ci_level: float,
) -> PatchResult:
    """A caller's metric: a scalar per cell, or a value per example with bootstrap intervals."""
    grid, n = (len(inp.layers), *inp.cell_shape), inp.n
    ci_low = ci_high = None
    flat = [v for row in custom_vals for v in row]
    shapes = {tuple(v.shape) for v in flat}
    if shapes == {()}:
        values = torch.stack(flat).reshape(grid)
        per_example = None
    elif shapes == {(n,)}:
        per_example = torch.stack(flat).reshape(*grid, n)
        values = per_example.mean(-1)
        if n_bootstrap > 0:
            ci_low, ci_high = bootstrap_ratio_ci(per_example, None, n_bootstrap, seed, ci_level)
    else:
        raise ValueError(
            f"patch: metric must return a scalar or a [{n}] tensor, got shapes {sorted(shapes)}"
        )
    return _patch_result(
        inp,
        values,
        per_example,
        ci_low,
        ci_high,
        metric_name=getattr(metric, "__name__", "custom"),
        clean_value=float(torch.as_tensor(metric(clean_logits)).double().mean()),
        corrupt_value=float(torch.as_tensor(metric(corrupt_logits)).double().mean()),
        n_bootstrap=n_bootstrap if ci_low is not None else 0,
        ci_level=ci_level,
        extra={},
    )


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

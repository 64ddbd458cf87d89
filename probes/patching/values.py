"""What :func:`probes.patching.sweep.patch` returns from its patched cells: the normalised logit
difference (1 at the clean run, 0 at the corrupt one) with paired bootstrap intervals of the ratio,
or a caller's metric."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from probes.patching.checks import PatchInputs
from probes.patching.metric import bootstrap_ratio_ci, logit_diff
from probes.patching.result import PatchResult

if TYPE_CHECKING:
    pass


DEFAULT_METRIC_NAME = "normalized_logit_diff"


def _patch_result(inp: PatchInputs, values, per_example, ci_low, ci_high, **kw: Any) -> PatchResult:
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


def normalised_result(
    inp: PatchInputs,
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


def custom_result(
    inp: PatchInputs,
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


__all__ = ["DEFAULT_METRIC_NAME", "custom_result", "normalised_result"]

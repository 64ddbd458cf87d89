"""What :func:`probes.patching.sweep.patch` checks before its sweep, in one place: the tokens,
the pairs (their clean and corrupt runs must differ for the default metric), the sites, layers
and options; and the cells the checked call patches (:class:`PatchInputs`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    FiniteWatch,
    check_count,
    check_examples,
    check_finite_model,
    check_layers,
    check_token_tensor,
)
from probes.patching.cells import (
    BLOCK_SITES,
    SITES,
    cell_layout,
)
from probes.patching.metric import logit_diff

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel


DIRECTIONS = ("clean_to_corrupt", "corrupt_to_clean")


def check_tokens(name: str, t: Tensor) -> Tensor:
    try:
        check_token_tensor(t, name)
    except ValueError as err:
        raise ValueError(f"patch: {err}") from None
    if t.ndim != 2:
        raise ValueError(
            f"patch: {name} must be a [batch, pos] integer tensor, got shape {tuple(t.shape)}"
        )
    return t


def check_pairs_differ(
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


@dataclass(frozen=True, eq=False)
class PatchInputs:
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


def check_patch(
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
) -> PatchInputs:
    """Every check of :func:`patch`, in order, and the cells; the only forwards are the pairs'
    own check (:func:`check_pairs_differ`), before any patching."""
    check_finite_model(model, "patch")
    if site not in SITES:
        raise ValueError(f"patch: unknown site {site!r}; expected one of {', '.join(SITES)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"patch: direction must be one of {DIRECTIONS}, got {direction!r}")
    clean_tokens, corrupt_tokens = _check_shapes(clean_tokens, corrupt_tokens, pad_mask)
    n, n_pos = clean_tokens.shape
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
    if default_metric and (clean_labels is None or corrupt_labels is None):
        raise ValueError(
            "patch: the default metric needs clean_labels and corrupt_labels (or pass metric=)"
        )
    clean_tokens, corrupt_tokens, clean_labels, corrupt_labels, pad_mask = _check_examples(
        model, clean_tokens, corrupt_tokens, clean_labels, corrupt_labels, pad_mask, default_metric
    )
    if direction == "clean_to_corrupt":
        src_tokens, recv_tokens = clean_tokens, corrupt_tokens
    else:
        src_tokens, recv_tokens = corrupt_tokens, clean_tokens

    masks, cell_shape, axis_names, chunk, group = _cells(
        model, site, by_position, n_pos, n, default_metric, batch_size
    )
    return PatchInputs(
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


def _check_examples(
    model: ProbeModel,
    clean_tokens: Tensor,
    corrupt_tokens: Tensor,
    clean_labels: Tensor | None,
    corrupt_labels: Tensor | None,
    pad_mask: Tensor | None,
    default_metric: bool,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Both runs checked on the model's device, and (the default metric) the pairs' own check."""
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
        check_pairs_differ(model, clean_tokens, corrupt_tokens, clean_labels, corrupt_labels, mask)
    return clean_tokens, corrupt_tokens, clean_labels, corrupt_labels, pad_mask


def _check_shapes(
    clean_tokens: Tensor, corrupt_tokens: Tensor, pad_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Two ``[n, pos]`` token tensors of one shape, ``n > 0``, and a pad mask that fits them."""
    clean_tokens = check_tokens("clean_tokens", clean_tokens)
    corrupt_tokens = check_tokens("corrupt_tokens", corrupt_tokens)
    if clean_tokens.shape != corrupt_tokens.shape:
        raise ValueError(
            f"patch: clean and corrupt tokens must have the same shape, got {tuple(clean_tokens.shape)} "
            f"and {tuple(corrupt_tokens.shape)}"
        )
    n = clean_tokens.shape[0]
    if n == 0:
        raise ValueError("patch: no examples")
    if pad_mask is not None and (
        pad_mask.shape != clean_tokens.shape or pad_mask.dtype != torch.bool
    ):
        raise ValueError(
            f"patch: pad_mask must be a bool tensor shaped {tuple(clean_tokens.shape)}"
        )
    return clean_tokens, corrupt_tokens


def _cells(
    model: ProbeModel,
    site: str,
    by_position: bool,
    n_pos: int,
    n: int,
    default_metric: bool,
    batch_size: int,
) -> tuple[Tensor, tuple[int, ...], tuple[str, ...], int, int]:
    """The patch cells of ``site`` (masks on the model's device, their grid shape and axis names)
    and how many examples and cells share a forward."""
    cfg, device = model.cfg, model.W_E.device
    heads = cfg.n_heads
    if site in ("k", "v"):
        heads = model.kv_layout.n_kv_heads  # grouped heads: hook_k/hook_v carry those heads only
    masks, cell_shape, axis_names = cell_layout(site, by_position, n_pos, heads)
    masks = masks.to(device)
    chunk = n if not default_metric else min(n, batch_size)
    group = max(1, batch_size // chunk)
    return masks, cell_shape, axis_names, chunk, group


__all__ = ["DIRECTIONS", "PatchInputs", "check_pairs_differ", "check_patch", "check_tokens"]

"""Views of an activation-patching result: its heatmaps and a per-token circuitsvis view."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from probes.common.figures import pyplot
from probes.common.html import colored_tokens_html, offline_html


def patching_tokens_html(
    result: Any,
    labels: Sequence[str],
    *,
    head: int | None = None,
    layers: Sequence[int] | None = None,
    example: int | None = None,
) -> str:
    """Coloured-token view of a by-position :class:`~probes.patching.sweep.PatchResult`, as offline HTML.

    One series per layer (and per head for head sites, or only ``head``), each colouring the
    tokens by the patching effect at that position; circuitsvis' ``colored_tokens_multi`` shows
    one series at a time (buttons) and all values on hover. One widget, so the 1.3 MB bundle is
    inlined once. A single series uses ``colored_tokens`` (symmetric colour scale).

    ``example``: show that example's per-example values (whose positions match ``labels``)
    instead of the mean over examples."""
    if not result.by_position:
        raise ValueError("patching_tokens_html needs a by-position result (by_position=True)")
    axes = result.axis_names
    if example is None:
        vals = result.values.detach().float().cpu()
    else:
        if result.per_example is None:
            raise ValueError("patching_tokens_html: this result has no per-example values")
        vals = result.per_example[..., example].detach().float().cpu()
    series: list[tuple[str, Tensor]] = []
    for li, layer in enumerate(result.layers):
        if layers is not None and layer not in layers:
            continue
        v = vals[li]
        if axes == ("layer", "pos", "head"):
            series += [
                (f"L{layer}H{h}", v[:, h]) for h in (range(v.shape[1]) if head is None else [head])
            ]
        elif axes == ("layer", "head", "dest_pos"):
            series += [
                (f"L{layer}H{h} dest", v[h])
                for h in (range(v.shape[0]) if head is None else [head])
            ]
        else:
            series.append((f"L{layer}", v))
    if not series:
        raise ValueError("patching_tokens_html: nothing selected")
    for name, row in series:
        if row.shape[0] != len(labels):
            raise ValueError(
                f"patching_tokens_html: {len(labels)} labels but {row.shape[0]} positions ({name})"
            )
    if len(series) == 1:
        vmax = float(series[0][1].abs().max()) or 1.0
        return colored_tokens_html(labels, series[0][1], min_value=-vmax, max_value=vmax)
    import circuitsvis.tokens

    values = torch.stack([row for _, row in series], dim=1)  # [pos, series]
    return offline_html(
        circuitsvis.tokens.colored_tokens_multi(list(labels), values, [n for n, _ in series])
    )


def plot_patching(result: Any, path: str | Path, *, title: str | None = None) -> list[Path]:
    """Heatmap(s) of a :class:`~probes.patching.sweep.PatchResult`: one figure for 1-2-D grids; for
    3-D grids (by-position head sites) one panel per layer. Returns the written paths."""
    plt = pyplot()
    vals = result.values.detach().float().cpu()
    axes = result.axis_names
    vmax = float(vals.abs().max()) or 1.0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = title or f"patching {result.site} ({result.direction}, {result.metric_name})"
    if vals.ndim == 1:
        vals = vals[:, None]
        axes = (*axes, "")
    if vals.ndim == 2:
        fig, ax = plt.subplots(
            figsize=(max(4, 0.35 * vals.shape[1] + 2), max(2.5, 0.4 * vals.shape[0] + 1.5))
        )
        im = ax.imshow(vals.numpy(), cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_xlabel(axes[1])
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(result.layers)), [str(layer) for layer in result.layers])
        fig.colorbar(im, ax=ax)
        ax.set_title(title, fontsize=9)
    else:
        n = vals.shape[0]
        fig, axs = plt.subplots(
            n, 1, figsize=(max(5, 0.08 * vals.shape[1] + 3), 2.0 * n + 1), squeeze=False
        )
        for li in range(n):
            ax = axs[li, 0]
            grid = vals[li] if axes[1] == "head" else vals[li].T  # rows: heads
            if axes[1] == "head":
                xlab = axes[2]
            else:
                xlab = axes[1]
            im = ax.imshow(
                grid.numpy(),
                cmap="RdBu",
                vmin=-vmax,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_ylabel(f"L{result.layers[li]} head")
            ax.set_xlabel(xlab)
            fig.colorbar(im, ax=ax)
        axs[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]

"""Figures of a head-ablation sweep: the layers x heads drop heatmap and per-layer lines."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from probes.ablation import AblationResult
from probes.common.figures import figure, save_figure
from probes.heads.patterns import PAD_LABEL, AttentionPatterns, attention_patterns, token_labels  # noqa: F401 (PAD_LABEL)


def _title(result: AblationResult, what: str) -> str:
    enc = result.meta.get("encoding")
    return f"{what}: {result.method}-ablation, {result.metric}" + (f" ({enc})" if enc else "")


def plot_drop_heatmap(
    result: AblationResult,
    path: str | os.PathLike[str] | None = None,
    *,
    annotate: bool | None = None,
    deposits: Sequence[tuple[int, int]] = (),
    title: str | None = None,
) -> Figure:
    """Layers x heads heatmap of the drops (positive = ablation hurt; diverging colours centred
    on 0), annotated with the values (default when there are <= 32 heads); heads in
    ``deposits`` are outlined."""
    if not result.is_grid:
        raise ValueError("plot_drop_heatmap needs a layers x heads sweep")
    drops = result.drops
    L, H = drops.shape
    annotate = H <= 32 if annotate is None else annotate
    fig = figure((max(4.0, 0.55 * H + 2.0), max(2.5, 0.5 * L + 1.5)))
    ax = fig.add_subplot()
    vmax = float(np.nanmax(np.abs(drops))) if np.isfinite(drops).any() else 1.0
    vmax = vmax or 1.0
    im = ax.imshow(np.ma.masked_invalid(drops), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
    fig.colorbar(im, ax=ax, label=f"drop in {result.metric} (+ = hurt)")
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if annotate:
        fmt = "{:.2f}" if vmax >= 0.1 else "{:.3f}"
        for layer in range(L):
            for h in range(H):
                v = drops[layer, h]
                if np.isfinite(v):
                    ax.text(
                        h,
                        layer,
                        fmt.format(v),
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if abs(v) > 0.6 * vmax else "black",
                    )
    for layer, h in deposits:
        ax.add_patch(
            Rectangle((h - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2)
        )
    ax.set_title(
        title or f"{_title(result, 'head ablation')}; baseline {result.baseline:.3f}", fontsize=9
    )
    return save_figure(fig, path)


def plot_layer_lines(
    result: AblationResult,
    path: str | os.PathLike[str] | None = None,
    *,
    separate: bool = False,
    title: str | None = None,
) -> Figure:
    """The paper's per-layer plots: the metric with each head ablated vs head index, one line
    per layer, the unablated baseline dashed. ``separate=True`` draws one panel per layer (as
    the authors' scripts did) instead of one shared panel."""
    if not result.is_grid:
        raise ValueError("plot_layer_lines needs a layers x heads sweep")
    L, H = result.values.shape
    layers = [layer for layer in range(L) if np.isfinite(result.values[layer]).any()]
    if separate:
        cols = min(3, len(layers))
        rows = -(-len(layers) // cols)
        fig = figure((4.0 * cols, 2.8 * rows))
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax in axes[len(layers) :]:
            ax.set_visible(False)
    else:
        fig = figure((7.0, 4.0))
        axes = [fig.add_subplot()] * len(layers)
    for ax, layer in zip(axes, layers):
        ax.plot(range(H), result.values[layer], marker="o", markersize=3, label=f"layer {layer}")
        if separate:
            ax.set_title(f"layer {layer}", fontsize=9)
    for ax in axes[: len(layers) if separate else 1]:
        ax.axhline(result.baseline, linestyle="--", color="gray", label="baseline")
        ax.set_xlabel("ablated head")
        ax.set_ylabel(result.metric)
        ax.set_xticks(range(H))
    if not separate and layers:
        axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(title or _title(result, "per-layer head ablation"), fontsize=10)
    return save_figure(fig, path)

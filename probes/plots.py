"""Figures for head-ablation sweeps and deposit dynamics (matplotlib, Agg canvas).

Every function builds a standalone :class:`matplotlib.figure.Figure` on an Agg canvas (no pyplot
state, no global backend switch, nothing left open), returns it, and saves a PNG when ``path`` is
given. In a notebook the returned figure displays inline.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from probes.ablation import AblationResult
from probes.deposit import dynamics_arrays, load_dynamics


def _figure(figsize: tuple[float, float]) -> Figure:
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike[str] | None, dpi: int = 120) -> Figure:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    return fig


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
    fig = _figure((max(4.0, 0.55 * H + 2.0), max(2.5, 0.5 * L + 1.5)))
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
                    ax.text(h, layer, fmt.format(v), ha="center", va="center", fontsize=7,
                            color="white" if abs(v) > 0.6 * vmax else "black")  # fmt: skip
    for layer, h in deposits:
        ax.add_patch(Rectangle((h - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    ax.set_title(title or f"{_title(result, 'head ablation')}; baseline {result.baseline:.3f}", fontsize=9)
    return _save(fig, path)


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
        fig = _figure((4.0 * cols, 2.8 * rows))
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax in axes[len(layers) :]:
            ax.set_visible(False)
    else:
        fig = _figure((7.0, 4.0))
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
    return _save(fig, path)


def plot_dynamics(
    records: Sequence[dict[str, Any]] | str | os.PathLike[str],
    layer: int = 0,
    path: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
) -> Figure:
    """Deposit dynamics of one layer: each head's drop vs training step (top panel, the final
    top head highlighted) and the first-to-second margin (bottom panel). ``records`` is what
    :class:`~probes.deposit.DepositDynamics` recorded, or its JSONL file / run dir."""
    if not isinstance(records, Sequence) or isinstance(records, str):
        records = load_dynamics(records)
    a = dynamics_arrays(records, layer)
    steps, drops = a["steps"], a["drops"]
    final_top = int(a["top_head"][-1])
    fig = _figure((7.0, 5.0))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for h in range(drops.shape[1]):
        top = h == final_top
        ax1.plot(steps, drops[:, h], color="C3" if top else "0.6", linewidth=2.0 if top else 0.8,
                 label=f"head {h} (final top)" if top else None, zorder=3 if top else 2)  # fmt: skip
    ax1.axhline(0.0, color="black", linewidth=0.5)
    metric = records[0].get("metric", "metric") if records else "metric"
    ax1.set_ylabel(f"drop in {metric}")
    ax1.legend(fontsize=8)
    ax2.plot(steps, a["margin"], color="C0", marker="o", markersize=3, label="margin (1st - 2nd)")
    ax2b = ax2.twinx()
    ax2b.plot(steps, a["baseline"], color="C2", linestyle="--", label=f"baseline {metric}")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("margin")
    ax2b.set_ylabel(f"baseline {metric}")
    lines = ax2.get_legend_handles_labels()
    lines_b = ax2b.get_legend_handles_labels()
    ax2.legend(lines[0] + lines_b[0], lines[1] + lines_b[1], fontsize=8)
    fig.suptitle(title or f"deposit dynamics, layer {layer}", fontsize=10)
    return _save(fig, path)


__all__ = ["plot_drop_heatmap", "plot_dynamics", "plot_layer_lines"]

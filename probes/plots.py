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
        ax1.plot(
            steps,
            drops[:, h],
            color="C3" if top else "0.6",
            linewidth=2.0 if top else 0.8,
            label=f"head {h} (final top)" if top else None,
            zorder=3 if top else 2,
        )
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


def plot_snapshot_dynamics(result: Any, path: str | os.PathLike[str] | None = None) -> Figure:
    """A run's deposit over training (:class:`probes.deposit.trajectory.SnapshotDynamics`): every
    head's drop at every snapshot (heads x steps), the top head, the runner-up and each layer's
    summed drop over steps, and the steps where a criterion holds (marked above)."""
    records = result.records
    steps = [r["step"] for r in records]
    drops = np.array([np.asarray(r["drops"], dtype=float) for r in records])  # [step, layer, head]
    n_layers, n_heads = drops.shape[1:]
    flat = drops.reshape(len(steps), -1)
    fig = _figure((11, 6.5))
    heat, lines = fig.subplots(2, 1, height_ratios=[3, 2], sharex=True)
    im = heat.imshow(
        100 * flat.T,
        aspect="auto",
        cmap="magma",
        vmin=0,
        vmax=max(1.0, 100 * np.nanmax(flat)),
        interpolation="nearest",
    )
    heat.set_yticks(
        [layer * n_heads for layer in range(n_layers)], [f"L{layer}H0" for layer in range(n_layers)]
    )
    heat.set_ylabel("head")
    fig.colorbar(im, ax=heat, label="drop when zero-ablated (points)")
    x = np.arange(len(steps))
    order = np.sort(flat, axis=1)
    lines.plot(x, 100 * order[:, -1], color="C3", lw=2, label="top head")
    lines.plot(x, 100 * order[:, -2], color="C3", ls="--", label="runner-up")
    for layer in range(n_layers):
        lines.plot(
            x,
            100 * np.clip(drops[:, layer], 0, None).sum(1),
            lw=0.8,
            alpha=0.7,
            label=f"layer {layer} (sum)",
        )
    lines.axhline(50, color="grey", lw=0.6, ls=":")
    marks = {
        "single_head": ("single-head deposit", "C3", 1.0),
        "layer0": ("layer-0 concentration", "C0", 0.9),
        "positional": ("positional deposit", "C2", 0.8),
    }
    for name, (label, color, y) in marks.items():
        held = [
            i for i, r in enumerate(records) if r["verdicts"].get(name, {}).get("verdict") == "yes"
        ]
        if held:
            lines.scatter(
                held,
                [lines.get_ylim()[1] * y] * len(held),
                marker="v",
                color=color,
                label=f"{label} holds",
            )
    lines.set_xticks(x, [str(s) for s in steps], rotation=90, fontsize=7)
    lines.set_xlabel("training step (snapshot)")
    lines.set_ylabel("drop (points)")
    lines.legend(fontsize=7, ncol=3, loc="upper right")
    return _save(fig, path)

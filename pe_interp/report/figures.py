"""The report's figures, as PNG data URIs (matplotlib's Agg canvas; no pyplot, no global state)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import math
import textwrap

import numpy as np

from pe_interp.report.data import KIND_ORDER, TASK_TITLES, CellInfo, label_order, task_order
from pe_interp.report.labels import paper_acc
from pe_interp.sweep.probing import ROTARY_KINDS
from probes import AblationResult
from probes.ablation.view import plot_drop_heatmap, plot_layer_lines
from probes.deposit.view import plot_dynamics

KIND_COLORS = {
    "none": "#7f7f7f",
    "additive": "#1f77b4",
    "multiplicative": "#d62728",
    "hybrid": "#9467bd",
}


def new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_data_uri(fig, dpi: int = 100) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def save_png(fig, path, dpi: int = 100):
    """Write ``fig`` as a PNG file (atomically: a temporary file, then a rename)."""
    import os
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=dpi)
    os.replace(tmp, path)
    return path


def wrapped(title: str, width_in: float, fontsize: float = 10) -> str:
    """``title`` broken into lines that fit a figure ``width_in`` inches wide (so that
    constrained layout never clips it)."""
    # a title is centred over the axes, which are about 70% of the figure (labels, colour bar)
    per_line = max(20, int(0.7 * width_in * 72 / (0.6 * fontsize)))
    return textwrap.fill(title, per_line, break_long_words=False, break_on_hyphens=False)


def _paper_number(label: str, task: str) -> float | None:
    text = paper_acc(label, task)
    head = text.split(" ")[0]
    try:
        return float(head) / 100.0
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------
def accuracy_bars(
    cells: list[CellInfo], acc: dict, baselines: dict[str, dict[str, float]]
) -> str | None:
    tasks = task_order(cells)
    labels = label_order(cells)
    if not tasks or not labels:
        return None
    kind_of = {c.label: c.kind for c in cells}
    fig = new_figure(max(6.0, 0.55 * len(labels) + 2) * len(tasks) / 1.4, 4.2)
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(1, len(tasks), i + 1)
        xs = np.arange(len(labels))
        for x, label in zip(xs, labels):
            s = acc.get((label, task))
            if s is None:
                continue
            ax.bar(
                x,
                100 * s.mean,
                color=KIND_COLORS.get(kind_of[label], "#333"),
                alpha=0.85,
                yerr=100 * s.std if s.n > 1 else None,
                capsize=3,
            )
            ax.scatter([x] * s.n, [100 * v for v in s.values], s=8, color="black", zorder=3)
            p = _paper_number(label, task)
            if p is not None:
                ax.scatter(
                    [x],
                    [100 * p],
                    marker="D",
                    s=28,
                    facecolor="none",
                    edgecolor="black",
                    zorder=4,
                    label="paper [S]"
                    if "paper [S]" not in ax.get_legend_handles_labels()[1]
                    else None,
                )
        b = baselines.get(task)
        if b:
            ax.axhline(100 * b["chance"], color="black", ls=":", lw=1, label="chance")
            ax.axhline(
                100 * b["length_only"], color="black", ls="--", lw=1, label="length-only ceiling"
            )
        ax.set_xticks(xs, labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("held-out accuracy %")
        ax.set_title(TASK_TITLES.get(task, task))
        ax.legend(fontsize=7, loc="upper left")
    from matplotlib.patches import Patch

    handles = [Patch(color=KIND_COLORS[k], label=k) for k in KIND_ORDER if k in kind_of.values()]
    fig.legend(
        handles=handles, loc="outside upper center", ncol=len(handles), fontsize=8, frameon=False
    )
    return to_data_uri(fig)


def mean_drops(models: list[CellInfo]) -> np.ndarray | None:
    grids = [c.ablation.drops for c in models if c.ablation is not None]
    if not grids or any(g.shape != grids[0].shape for g in grids):
        return grids[0] if grids else None
    with np.errstate(invalid="ignore"):
        return np.nanmean(np.stack(grids), axis=0)


def grid_heatmap(
    values: np.ndarray,
    title: str,
    cbar: str,
    cmap: str = "viridis",
    xlabel: str = "head",
    ylabel: str = "layer",
    center: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    yticks: list | None = None,
) -> str:
    """A layers x heads (or any 2-D) heatmap at a readable size: cells of about 0.6 inch, the
    values written in them (up to 128 cells), the title wrapped to the figure's width."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[None, :]
    w = min(14.0, max(6.0, 0.6 * v.shape[1] + 3.0))
    h = min(12.0, max(3.2, 0.55 * v.shape[0] + 2.4))
    fig = new_figure(w, h)
    ax = fig.add_subplot(1, 1, 1)
    if center:
        lim = (float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 1.0) or 1.0
        im = ax.imshow(v, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    else:
        im = ax.imshow(v, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(v.shape[1]))
    ax.set_yticks(range(v.shape[0]), yticks if yticks is not None else range(v.shape[0]))
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.set_title(wrapped(title, w), fontsize=10)
    ax.tick_params(labelsize=9)
    if v.size <= 128:
        norm = im.norm
        for (y, x), val in np.ndenumerate(v):
            if not math.isnan(val):
                shade = float(
                    norm(val)
                )  # dark cells (either end of a diverging map) get white text
                dark = (
                    (shade < 0.2 or shade > 0.8)
                    if center
                    else shade < (0.45 if cmap == "viridis" else 0.0)
                )
                ax.text(
                    x,
                    y,
                    f"{val:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "black",
                )
    fig.colorbar(im, ax=ax, shrink=0.9).set_label(cbar, fontsize=9)
    return to_data_uri(fig)


def attention_image(pattern: np.ndarray, tokens: list[str], title: str) -> str:
    """A static attention-pattern image (used only when circuitsvis cannot be inlined)."""
    fig = new_figure(4, 4)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(pattern, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=5)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=5)
    ax.set_xlabel("key (source)")
    ax.set_ylabel("query (destination)")
    ax.set_title(title, fontsize=8)
    return to_data_uri(fig)


def rotary_task1_labels(cells: list[CellInfo]) -> list[str]:
    return [
        lab
        for lab in label_order(cells)
        if any(c.label == lab and c.task == "distance" and c.kind in ROTARY_KINDS for c in cells)
    ]


# ------------------------------------------------------------------------------------------------
# figures drawn by the probes' views
# ------------------------------------------------------------------------------------------------
def mean_result(models: list[CellInfo]) -> AblationResult | None:
    """An ``AblationResult`` of one model, or of the mean drops over seeds (CIs left out)."""
    results = [c.ablation for c in models if c.ablation is not None]
    if not results:
        return None
    results = [r for r in results if r.drops.shape == results[0].drops.shape]
    if len(results) == 1:
        return results[0]
    nan = np.full_like(results[0].drops, math.nan)
    with np.errstate(invalid="ignore"):
        return dataclasses.replace(
            results[0],
            baseline=float(np.mean([r.baseline for r in results])),
            values=np.nanmean(np.stack([r.values for r in results]), 0),
            drops=np.nanmean(np.stack([r.drops for r in results]), 0),
            ci_low=nan,
            ci_high=nan,
            per_example=None,
            baseline_per_example=None,
        )


def model_heatmap(models: list[CellInfo], title: str, vmax: float | None = None) -> str | None:
    """probes.ablation.view's layers × heads drop heatmap (mean over seeds), flagged heads outlined.

    ``vmax`` puts every model of a task on one colour scale (``plot_drop_heatmap`` scales each
    figure to its own largest drop, which makes a 1-point drop look as strong as a 60-point one).
    """
    result = mean_result(models)
    if result is None:
        return None
    flagged = sorted({h for c in models for h in c.flagged})
    fig = plot_drop_heatmap(
        result,
        deposits=flagged,
        title=wrapped(title, max(4.0, 0.55 * result.drops.shape[1] + 2.0), 9),
    )
    if vmax is not None and fig.axes and fig.axes[0].images:
        ax = fig.axes[0]
        ax.images[0].set_clim(-vmax, vmax)
        for t in ax.texts:
            with contextlib.suppress(ValueError):
                t.set_color("white" if abs(float(t.get_text())) > 0.6 * vmax else "black")
    return to_data_uri(fig)


def common_vmax(cells: list[CellInfo], task: str, floor: float = 0.05) -> float:
    """One colour scale for a task's heatmaps: the largest |mean drop|, at least ``floor``."""
    vals = [floor]
    for lab in {c.label for c in cells if c.task == task}:
        g = mean_drops([c for c in cells if c.label == lab and c.task == task])
        if g is not None and np.isfinite(g).any():
            vals.append(float(np.nanmax(np.abs(g))))
    return max(vals)


def model_layer_lines(cell: CellInfo, title: str) -> str | None:
    if cell.ablation is None:
        return None
    fig = plot_layer_lines(cell.ablation, separate=True, title=title)
    if cell.ablation.metric == "accuracy":  # the whole accuracy range, so small wiggles look small
        for ax in fig.axes:
            if ax.get_visible():
                ax.set_ylim(0.0, 1.0)
    return to_data_uri(fig)


def model_dynamics(cell: CellInfo, title: str) -> str | None:
    records = cell.dynamics()
    if not records:
        return None
    return to_data_uri(plot_dynamics(records, layer=0, title=title))


def logit_terms_figure(record: dict, title: str) -> str | None:
    """The grouped attention-logit terms of one head (a cell's ``decomposition.json``: content /
    position / offset Gram terms or ``qk``, the relative bias, their sum and the model's actual
    logits), one panel each on a shared colour scale; entries the mask removes are blank."""
    mats = record.get("matrices") or {}
    if not mats:
        return None
    region = np.asarray(record["region"], dtype=bool)
    arrays = {k: np.where(region, np.asarray(v, dtype=np.float64), np.nan) for k, v in mats.items()}
    vmax = (
        max(
            (float(np.nanmax(np.abs(a))) for a in arrays.values() if np.isfinite(a).any()),
            default=1.0,
        )
        or 1.0
    )
    cols = min(4, len(arrays))
    rows = -(-len(arrays) // cols)
    w = 3.3 * cols + 0.8
    fig = new_figure(w, 3.1 * rows + 0.6)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    shares = record.get("grouped_variance_shares", {})
    im = None
    for ax, (name, a) in zip(axes, arrays.items()):
        im = ax.imshow(a, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
        share = shares.get(name)
        ax.set_title(
            name
            + (
                f" ({100 * share:.0f}% of var.)"
                if isinstance(share, float) and math.isfinite(share)
                else ""
            ),
            fontsize=9,
        )
        ax.set_xlabel("key position", fontsize=8)
        ax.set_ylabel("query position", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(arrays) :]:
        ax.set_visible(False)
    fig.colorbar(im, ax=list(axes[: len(arrays)]), shrink=0.8).set_label("logit", fontsize=9)
    fig.suptitle(wrapped(title, w, 10), fontsize=10)
    return to_data_uri(fig)

"""The report's figures, as PNG data URIs (matplotlib's Agg canvas; no pyplot, no global state)."""

from __future__ import annotations

import base64
import contextlib
import io
import math
from typing import Any

import numpy as np

from pe_interp.report.data import KIND_ORDER, TASK_TITLES, CellInfo, label_order, task_order

KIND_COLORS = {"none": "#7f7f7f", "additive": "#1f77b4", "multiplicative": "#d62728", "hybrid": "#9467bd"}
ROTARY_KINDS = ("multiplicative", "hybrid")


def new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_data_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _paper_number(label: str, task: str) -> float | None:
    from pe_interp.report.summary import paper_acc

    text = paper_acc(label, task)
    head = text.split(" ")[0]
    try:
        return float(head) / 100.0
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------
def accuracy_bars(cells: list[CellInfo], acc: dict, baselines: dict[str, dict[str, float]]) -> str | None:
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
            ax.bar(x, 100 * s.mean, color=KIND_COLORS.get(kind_of[label], "#333"), alpha=0.85,
                   yerr=100 * s.std if s.n > 1 else None, capsize=3)
            ax.scatter([x] * s.n, [100 * v for v in s.values], s=8, color="black", zorder=3)
            p = _paper_number(label, task)
            if p is not None:
                ax.scatter([x], [100 * p], marker="D", s=28, facecolor="none", edgecolor="black", zorder=4,
                           label="paper [S]" if "paper [S]" not in ax.get_legend_handles_labels()[1] else None)
        b = baselines.get(task)
        if b:
            ax.axhline(100 * b["chance"], color="black", ls=":", lw=1, label="chance")
            ax.axhline(100 * b["length_only"], color="black", ls="--", lw=1, label="length-only ceiling")
        ax.set_xticks(xs, labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("held-out accuracy %")
        ax.set_title(TASK_TITLES.get(task, task))
        ax.legend(fontsize=7, loc="upper left")
    from matplotlib.patches import Patch

    handles = [Patch(color=KIND_COLORS[k], label=k) for k in KIND_ORDER if k in kind_of.values()]
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), fontsize=8, frameon=False)
    return to_data_uri(fig)


def mean_drops(models: list[CellInfo]) -> np.ndarray | None:
    grids = [c.ablation.drops for c in models if c.ablation is not None]
    if not grids or any(g.shape != grids[0].shape for g in grids):
        return grids[0] if grids else None
    with np.errstate(invalid="ignore"):
        return np.nanmean(np.stack(grids), axis=0)


def ablation_heatmaps(cells: list[CellInfo], task: str) -> str | None:
    """One layers × heads panel of the mean single-head ablation drop per encoding."""
    labels = [lab for lab in label_order(cells)
              if any(c.label == lab and c.task == task and c.ablation is not None for c in cells)]
    if not labels:
        return None
    grids = {}
    for lab in labels:
        models = [c for c in cells if c.label == lab and c.task == task and c.ablation is not None]
        grids[lab] = (mean_drops(models), models)
    vmax = max(5.0, max(float(np.nanmax(100 * g)) for g, _ in grids.values() if g is not None))
    ncol = min(5, len(labels))
    nrow = math.ceil(len(labels) / ncol)
    L, H = next(iter(grids.values()))[0].shape
    fig = new_figure(ncol * max(2.4, 0.32 * H + 0.8), nrow * max(1.9, 0.32 * L + 1.1))
    im = None
    for i, lab in enumerate(labels):
        g, models = grids[lab]
        ax = fig.add_subplot(nrow, ncol, i + 1)
        im = ax.imshow(100 * g, cmap="magma_r", vmin=0, vmax=vmax, aspect="auto")
        base = np.mean([c.ablation.baseline for c in models])
        ax.set_title(f"{lab}\n{len(models)} seed(s), baseline {100 * base:.0f}%", fontsize=8)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        ax.set_xticks(range(g.shape[1]))
        ax.set_yticks(range(g.shape[0]))
        ax.tick_params(labelsize=6)
        if g.size <= 128:
            for (y, x), v in np.ndenumerate(100 * g):
                if not math.isnan(v) and abs(v) >= 0.5:
                    ax.text(x, y, f"{v:.0f}", ha="center", va="center", fontsize=6,
                            color="white" if v > 0.6 * vmax else "black")
    if im is not None:
        cb = fig.colorbar(im, ax=fig.axes, shrink=0.8)
        cb.set_label("accuracy drop (points), mean over seeds", fontsize=8)
    fig.suptitle(f"{TASK_TITLES.get(task, task)}: single-head ablation drop", fontsize=10)
    return to_data_uri(fig)


def layer_lines(models: list[CellInfo], label: str) -> str | None:
    """The paper's view: accuracy after ablating each head, one panel per layer, a line per seed."""
    models = [c for c in models if c.ablation is not None]
    if not models:
        return None
    L, H = models[0].ablation.drops.shape
    ncol = min(L, 6)
    nrow = math.ceil(L / ncol)
    fig = new_figure(ncol * 2.5, nrow * 2.2)
    for layer in range(L):
        ax = fig.add_subplot(nrow, ncol, layer + 1)
        for c in models:
            a = c.ablation
            if a.drops.shape != (L, H):
                continue
            acc = 100 * (a.baseline - a.drops[layer])
            line = ax.plot(range(H), acc, marker="o", ms=3, lw=1, label=f"seed {c.seed}")[0]
            ax.axhline(100 * a.baseline, color=line.get_color(), ls="--", lw=0.8)
        ax.set_ylim(0, 100)
        ax.set_title(f"layer {layer}", fontsize=8)
        ax.set_xticks(range(H))
        ax.set_xlabel("ablated head", fontsize=7)
        if layer % ncol == 0:
            ax.set_ylabel("accuracy %", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.axes[0].legend(fontsize=6)
    fig.suptitle(f"{label}, task 1: accuracy with one head ablated (dashed: no ablation)", fontsize=9)
    return to_data_uri(fig)


def layer_margin(record: dict[str, Any], layer: int) -> float | None:
    m = record.get("margin")
    if m is not None and layer < len(m) and m[layer] is not None and not math.isnan(m[layer]):
        return float(m[layer])
    d = record["drops"]
    if layer >= d.shape[0]:
        return None
    row = np.sort(np.nan_to_num(d[layer], nan=-math.inf))[::-1]
    if not np.isfinite(row[0]):
        return None
    return float(row[0] - (row[1] if len(row) > 1 and np.isfinite(row[1]) else 0.0))


def dynamics_plot(dyn: list[dict[str, Any]], title: str) -> str | None:
    """Per-head drop of layer 0 over training, and each layer's top-minus-runner-up margin."""
    if len(dyn) < 1:
        return None
    steps = [d["step"] for d in dyn]
    L = max(d["drops"].shape[0] for d in dyn)
    H = max(d["drops"].shape[1] for d in dyn)
    fig = new_figure(9, 3.2)
    ax = fig.add_subplot(1, 2, 1)
    for h in range(H):
        ys = [100 * d["drops"][0, h] if d["drops"].shape[1] > h else math.nan for d in dyn]
        ax.plot(steps, ys, lw=1, marker=".", ms=3, label=f"L0H{h}")
    ax.set_xlabel("training step")
    ax.set_ylabel("drop when ablated (points)")
    ax.set_title("layer 0, per head", fontsize=9)
    if H <= 16:
        ax.legend(fontsize=6, ncol=2)
    ax2 = fig.add_subplot(1, 2, 2)
    for layer in range(L):
        ys = [layer_margin(d, layer) for d in dyn]
        ax2.plot(steps, [math.nan if v is None else 100 * v for v in ys], lw=1, marker=".", ms=3,
                 label=f"layer {layer}")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("top − runner-up drop (points)")
    ax2.set_title("margin per layer", fontsize=9)
    ax2.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return to_data_uri(fig)


def grid_heatmap(values: np.ndarray, title: str, cbar: str, cmap: str = "viridis",
                 xlabel: str = "head", ylabel: str = "layer", center: bool = False,
                 vmin: float | None = None, vmax: float | None = None, yticks: list | None = None) -> str:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[None, :]
    fig = new_figure(max(3.0, 0.35 * v.shape[1] + 1.6), max(2.0, 0.35 * v.shape[0] + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    if center:
        lim = float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 1.0
        im = ax.imshow(v, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    else:
        im = ax.imshow(v, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(v.shape[1]))
    ax.set_yticks(range(v.shape[0]), yticks if yticks is not None else range(v.shape[0]))
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    if v.size <= 128:
        for (y, x), val in np.ndenumerate(v):
            if not math.isnan(val):
                ax.text(x, y, f"{val:.2f}", ha="center", va="center", fontsize=6, color="black",
                        bbox={"facecolor": "white", "alpha": 0.5, "lw": 0, "pad": 0.5})
    fig.colorbar(im, ax=ax, shrink=0.85).set_label(cbar, fontsize=8)
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
    return [lab for lab in label_order(cells)
            if any(c.label == lab and c.task == "distance" and c.kind in ROTARY_KINDS for c in cells)]


# ------------------------------------------------------------------------------------------------
# figures drawn by probes.plots (with the report's own versions as a fallback)
# ------------------------------------------------------------------------------------------------
def probe_plots():
    """``probes.plots``, or None when it cannot be imported."""
    try:
        import probes.plots as pp
    except ImportError:
        return None
    return pp


def mean_result(models: list[CellInfo]):
    """An ``AblationResult`` of one model, or of the mean drops over seeds (CIs left out)."""
    import dataclasses

    from probes.ablation import AblationResult

    raws = [c.ablation_raw for c in models if c.ablation_raw is not None]
    if not raws:
        return None
    results = [AblationResult.from_dict(r) for r in raws]
    results = [r for r in results if r.is_grid and r.drops.shape == results[0].drops.shape]
    if len(results) == 1:
        return results[0]
    nan = np.full_like(results[0].drops, math.nan)
    with np.errstate(invalid="ignore"):
        return dataclasses.replace(
            results[0],
            baseline=float(np.mean([r.baseline for r in results])),
            values=np.nanmean(np.stack([r.values for r in results]), 0),
            drops=np.nanmean(np.stack([r.drops for r in results]), 0),
            ci_low=nan, ci_high=nan, per_example=None, baseline_per_example=None,
        )


def model_heatmap(models: list[CellInfo], title: str, vmax: float | None = None) -> str | None:
    """probes.plots' layers × heads drop heatmap (mean over seeds), flagged heads outlined.

    ``vmax`` puts every model of a task on one colour scale (``plot_drop_heatmap`` scales each
    figure to its own largest drop, which makes a 1-point drop look as strong as a 60-point one).
    """
    pp = probe_plots()
    if pp is None:
        return None
    result = mean_result(models)
    if result is None:
        return None
    flagged = sorted({h for c in models for h in c.flag.heads})
    fig = pp.plot_drop_heatmap(result, deposits=flagged, title=title)
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
    pp = probe_plots()
    if pp is None:
        return layer_lines([cell], cell.label)
    result = mean_result([cell])
    if result is None:
        return None
    fig = pp.plot_layer_lines(result, separate=True, title=title)
    if result.metric == "accuracy":  # the whole accuracy range, so small wiggles look small
        for ax in fig.axes:
            if ax.get_visible():
                ax.set_ylim(0.0, 1.0)
    return to_data_uri(fig)


def model_dynamics(cell: CellInfo, title: str) -> str | None:
    from pe_interp.report.data import load_dynamics_records, read_dynamics

    pp = probe_plots()
    records = load_dynamics_records(cell.run_dir)
    if not records:
        return None
    if pp is not None and all("layer" in r for r in records):
        return to_data_uri(pp.plot_dynamics(records, layer=0, title=title))
    return dynamics_plot(read_dynamics(cell.run_dir), title)

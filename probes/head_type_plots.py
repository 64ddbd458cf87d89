"""The figure of :class:`probes.head_types.HeadTypeScores`: one layers x heads heatmap per head
type (matplotlib, Agg canvas, as :mod:`probes.plots`: no pyplot state, a PNG when ``path`` is
given)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from probes.head_types import HEAD_TYPES, HeadTypeScores

__all__ = ["plot_head_types"]


def plot_head_types(
    result: HeadTypeScores,
    path: str | os.PathLike[str] | None = None,
    *,
    by: str = "score",
    annotate: bool | None = None,
    title: str | None = None,
) -> Figure:
    """One heatmap panel per head type of ``by`` (``"score"`` or ``"focus"``) over layers x
    heads, on a shared 0..1 colour scale; the heads of each type (focus >= its threshold) are
    outlined. Values are written in the cells when there are <= 16 heads per layer (default)."""
    if by not in ("score", "focus"):
        raise ValueError(f"by must be 'score' or 'focus', got {by!r}")
    n_layers, n_heads = result.shape
    annotate = n_heads <= 16 if annotate is None else annotate
    panel_w, panel_h = max(2.5, 0.45 * n_heads + 1.0), max(2.0, 0.32 * n_layers + 1.0)
    fig = Figure(figsize=(panel_w * len(HEAD_TYPES) + 1.0, panel_h + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(HEAD_TYPES), squeeze=False)[0]
    image = None
    for ax, kind in zip(axes, HEAD_TYPES, strict=True):
        values = (result.scores if by == "score" else result.focus)[kind].double().numpy()
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        typed = result.is_type(kind).numpy()
        for layer, head in zip(*np.nonzero(typed), strict=True):
            ax.add_patch(
                Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.5)
            )
        if annotate:
            for (layer, head), v in np.ndenumerate(values):
                if np.isfinite(v):
                    ax.text(
                        head,
                        layer,
                        f"{v:.2f}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white" if v < 0.6 else "black",
                    )
        ax.set_title(
            f"{kind.replace('_', ' ')} (>= {result.thresholds[kind]:g}: {int(typed.sum())})",
            fontsize=9,
        )
        ax.set_xlabel("head")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.tick_params(labelsize=6)
    axes[0].set_ylabel("layer")
    fig.colorbar(image, ax=list(axes), shrink=0.8, label=by)
    fig.suptitle(
        title or f"head types ({by}; outlined: focus >= threshold), {result.n_examples} prompts",
        fontsize=10,
    )
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig

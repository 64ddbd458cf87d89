"""The figure of :class:`probes.heads.types.HeadTypeScores`: one layers x heads heatmap per head
type (matplotlib, Agg canvas, as :mod:`probes.common.figures`: no pyplot state, a PNG when ``path`` is
given)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from probes.common.html import offline_html
from probes.heads.patterns import AttentionPatterns, attention_patterns
from probes.heads.types import HEAD_TYPES, HeadTypeScores

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

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


def attention_html(
    model: ProbeModel,
    tokens: Tensor,
    heads: Sequence[tuple[int, int]],
    *,
    example: int = 0,
    pad_mask: Tensor | None = None,
    labels: Sequence[str] | None = None,
    task: Any = None,
    crop_padding: bool = True,
) -> str:
    """circuitsvis ``attention_heads`` of the chosen ``(layer, head)`` pairs on one example, as
    offline HTML. Padding is cropped (pads attend nowhere useful) unless ``crop_padding=False``."""
    patterns = attention_patterns(
        model,
        tokens,
        heads,
        example=example,
        pad_mask=pad_mask,
        task=task,
        token_names=labels,
        crop_padding=crop_padding,
    )
    return patterns_html(patterns)


def patterns_html(
    patterns: AttentionPatterns, heads: Sequence[tuple[int, int]] | None = None
) -> str:
    """circuitsvis ``attention_heads`` of stored :class:`~probes.heads.patterns.AttentionPatterns` (all
    its heads, or ``heads`` in that order), as offline HTML."""
    import circuitsvis.attention

    heads = list(patterns.heads if heads is None else heads)
    pattern = torch.from_numpy(np.stack([patterns.head(*h) for h in heads])).float()
    rendered = circuitsvis.attention.attention_heads(
        attention=pattern,
        tokens=list(patterns.tokens),
        attention_head_names=[f"L{layer}H{h}" for layer, h in heads],
    )
    return offline_html(rendered)

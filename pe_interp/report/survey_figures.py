"""The survey's figures, drawn from its saved findings (:mod:`pe_interp.report.survey`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _heatmap(values: np.ndarray, path: Path, label: str, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n_layers, n_heads = values.shape
    fig = Figure(figsize=(max(4.0, 0.45 * n_heads + 2.5), max(3.0, 0.22 * n_layers + 1.5)))
    ax = fig.add_subplot()
    vmax = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    im = ax.imshow(values, cmap="RdBu_r", vmin=-(vmax or 1.0), vmax=vmax or 1.0, aspect="auto")
    fig.colorbar(im, ax=ax, label=label)
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(0, n_layers, max(1, n_layers // 10)))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def ablation_figure(result: dict[str, Any], path: Path) -> Path:
    """Every head's accuracy drop under zero-ablation, in points (+ = ablation hurt)."""
    drops = 100 * np.array(result["drops"], dtype=float)
    return _heatmap(
        drops, path, "accuracy drop (points, + = hurt)", "zero-ablation, one head at a time"
    )


def patching_figure(result: dict[str, Any], path: Path) -> Path:
    """Every head's patched share of the clean logit difference (1.0: restored)."""
    values = np.array(result["values"], dtype=float)
    return _heatmap(
        values, path, "restored (1.0 = clean)", "hook_z patched clean -> position-only corrupt"
    )


__all__ = ["ablation_figure", "patching_figure"]

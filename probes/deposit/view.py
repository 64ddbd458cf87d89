"""Figures of the deposit over training: the dynamics callback's curves and every snapshot's criteria."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from probes.common.figures import figure, save_figure
from probes.deposit import dynamics_arrays, load_dynamics
from probes.heads.patterns import PAD_LABEL, AttentionPatterns, attention_patterns, token_labels  # noqa: F401 (PAD_LABEL)


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
    fig = figure((7.0, 5.0))
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
    return save_figure(fig, path)


def plot_snapshot_dynamics(result: Any, path: str | os.PathLike[str] | None = None) -> Figure:
    """A run's deposit over training (:class:`probes.deposit.trajectory.SnapshotDynamics`): every
    head's drop at every snapshot (heads x steps), the top head, the runner-up and each layer's
    summed drop over steps, and the steps where a criterion holds (marked above)."""
    records = result.records
    steps = [r["step"] for r in records]
    drops = np.array([np.asarray(r["drops"], dtype=float) for r in records])  # [step, layer, head]
    n_layers, n_heads = drops.shape[1:]
    flat = drops.reshape(len(steps), -1)
    fig = figure((11, 6.5))
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
    return save_figure(fig, path)

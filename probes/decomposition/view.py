"""A figure of RoPE frequency usage (:class:`~probes.decomposition.FrequencyUsage`; matplotlib on an
Agg canvas, as :mod:`probes.common.figures`: no pyplot state, a PNG when ``path`` is given)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from probes.common.figures import pyplot
from probes.decomposition.frequency import FrequencyUsage

__all__ = ["plot_frequency_usage"]


def plot_frequency_usage(
    usage: FrequencyUsage,
    path: str | os.PathLike[str] | None = None,
    *,
    positional: Sequence[tuple[int, int]] = (),
    centred: bool = False,
    title: str | None = None,
) -> Figure:
    """Left: the q and k chunk-norm shares and the logit share against the frequency index (0 =
    highest frequency), averaged over every rotated head (bands shaded). Right: each head's logit
    share in the high band against its share in the low band (the diagonal: equal), the
    ``positional`` heads marked; points above the diagonal use the high band more (``centred``:
    the row-centred terms, :attr:`FrequencyUsage.pattern_share`)."""
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    n = usage.theta.shape[-1]
    x = np.arange(n)
    for name, share in (
        ("q norm", usage.q_share),
        ("k norm", usage.k_share),
        ("logit (squared terms)", usage.logit_share),
        ("logit, row-centred (pattern)", usage.pattern_share),
    ):
        if share is None:
            continue
        s = share.reshape(-1, n).numpy()
        ok = ~np.isnan(s).all(-1)
        if ok.any():
            ax.plot(x, np.nanmean(s[ok], 0), marker=".", label=name)
    high, low = usage.band_masks()
    k_hi, k_lo = int(high[0].sum()), int(low[0].sum())
    n0 = int(usage.n_pairs[0])
    ax.axvspan(-0.5, k_hi - 0.5, color="tab:red", alpha=0.08, label="high band")
    ax.axvspan(n0 - k_lo - 0.5, n0 - 0.5, color="tab:blue", alpha=0.08, label="low band")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("frequency index (0 = highest theta)")
    ax.set_ylabel("share (mean over heads)")
    ax.legend(fontsize=8)
    theta = usage.theta[0].numpy()
    if np.isfinite(theta).any():
        top = ax.secondary_xaxis("top")
        ticks = [i for i in (0, n0 // 2, n0 - 1) if i < n0]
        top.set_ticks(ticks, labels=[f"{theta[i]:.2g}" for i in ticks])
        top.set_xlabel("theta (rad/token)")

    hi, lo = (t.numpy() for t in usage.logit_bands(centred))
    pos = {(int(a), int(b)) for a, b in positional}
    mark = np.zeros(hi.shape, dtype=bool)
    for row, layer in enumerate(usage.layers):
        for h in range(hi.shape[1]):
            mark[row, h] = (layer, h) in pos
    bx.scatter(lo[~mark], hi[~mark], s=14, alpha=0.6, label="heads")
    if mark.any():
        bx.scatter(lo[mark], hi[mark], s=40, color="tab:red", label="positional heads")
        for row, h in zip(*np.nonzero(mark)):
            bx.annotate(f"L{usage.layers[row]}H{h}", (lo[row, h], hi[row, h]), fontsize=7)
    bx.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    bx.set_xlim(0, 1)
    bx.set_ylim(0, 1)
    what = "pattern share" if centred else "logit share"
    bx.set_xlabel(f"{what}, low band ({100 * usage.band:.0f}% slowest pairs)")
    bx.set_ylabel(f"{what}, high band ({100 * usage.band:.0f}% fastest pairs)")
    bx.legend(fontsize=8)
    fig.suptitle(title or f"RoPE frequency usage ({usage.n_examples} examples)")
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def _real_extent(terms: Any) -> int:
    """Number of leading positions to show: up to the last real query."""
    idx = terms.query_valid.nonzero()
    return int(idx.max()) + 1 if idx.numel() else terms.actual.shape[0]


def plot_logit_terms(terms: Any, path: str | Path, *, grouped: bool = False) -> Path:
    """One heatmap per term of a :class:`~probes.decomposition.LogitTerms`, plus the sum and the
    actual logits, on a shared colour scale (masked entries hatched out)."""
    plt = pyplot()
    mats = dict(terms.grouped() if grouped else terms.terms)
    mats["sum of terms"] = terms.total
    mats["actual"] = terms.actual
    region = terms.region.cpu()
    extent = _real_extent(terms)
    mats = {k: v[:extent, :extent] for k, v in mats.items()}
    region = region[:extent, :extent]
    vmax = (
        max(float(m.detach().abs()[region].max()) if region.any() else 1.0 for m in mats.values())
        or 1.0
    )
    n = len(mats)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axs = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax in axs.flat:
        ax.axis("off")
    for ax, (name, m) in zip(axs.flat, mats.items()):
        ax.axis("on")
        shown = m.detach().float().cpu().masked_fill(~region, float("nan"))
        im = ax.imshow(shown.numpy(), cmap="RdBu", vmin=-vmax, vmax=vmax, interpolation="nearest")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("key", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=axs.ravel().tolist(), shrink=0.6)
    fig.suptitle(
        f"L{terms.layer}H{terms.head} logit terms ({terms.encoding}), max err {terms.check():.1e}",
        fontsize=9,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rope_terms(terms: Any, path: str | Path) -> Path:
    """Per-frequency contributions of a rotary head (one panel per pair) and each pair's share."""
    plt = pyplot()
    rope = terms.rope
    if rope is None:
        raise ValueError("plot_rope_terms: this head has no rotary decomposition")
    extent = _real_extent(terms)
    region = terms.region.cpu()[:extent, :extent]
    pl = rope.pair_logits.detach().float().cpu()[:, :extent, :extent]
    vmax = float(pl.abs().max()) or 1.0
    n = rope.n_pairs + 1
    cols = min(5, n)
    rows = (n + cols - 1) // cols
    fig, axs = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.7 * rows), squeeze=False)
    for ax in axs.flat:
        ax.axis("off")
    share = rope.frequency_share()
    for k in range(rope.n_pairs):
        ax = axs.flat[k]
        ax.axis("on")
        ax.imshow(
            pl[k].masked_fill(~region, float("nan")).numpy(),
            cmap="RdBu",
            vmin=-vmax,
            vmax=vmax,
            interpolation="nearest",
        )
        ax.set_title(
            f"pair {k}: θ={float(rope.theta[k]):.3g}, {100 * float(share[k]):.0f}%", fontsize=7
        )
        ax.tick_params(labelsize=5)
    ax = axs.flat[rope.n_pairs]
    ax.axis("on")
    ax.bar(range(rope.n_pairs), share.float().numpy())
    ax.set_title("share per pair", fontsize=7)
    fig.suptitle(f"L{terms.layer}H{terms.head}: s·Re(G∘E) per frequency pair", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

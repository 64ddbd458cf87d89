"""Views: circuitsvis HTML (saved offline) and matplotlib figures for the probes.

circuitsvis' ``RenderedHTML`` has two forms: ``str(html)`` loads the JavaScript bundle from a CDN
(blank without network), ``html.local_src`` inlines it (about 1.3 MB) and works offline. Everything
here writes ``local_src``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.io import atomic_write_text
from probes.patterns import PAD_LABEL, AttentionPatterns, attention_patterns, token_labels  # noqa: F401 (PAD_LABEL)


# ---------------------------------------------------------------------------------------------
# circuitsvis (offline HTML)
# ---------------------------------------------------------------------------------------------
def offline_html(rendered: Any) -> str:
    """The self-contained HTML of a circuitsvis ``RenderedHTML`` (or a plain string)."""
    if isinstance(rendered, str):
        return rendered
    src = getattr(rendered, "local_src", None)
    if src is None:
        raise TypeError(
            f"offline_html: expected a circuitsvis RenderedHTML, got {type(rendered).__name__}"
        )
    return src


def save_html(rendered: Any, path: str | Path, title: str | None = None) -> Path:
    """Write ``rendered`` (RenderedHTML or HTML string) to ``path`` as an offline page."""
    body = offline_html(rendered)
    if title:
        body = f"<h3 style='font-family:sans-serif'>{title}</h3>\n{body}"
    return atomic_write_text(
        path,
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'></head><body>\n{body}\n</body></html>\n",
    )


def colored_tokens_html(
    labels: Sequence[str], values: Tensor | Sequence[float], **kwargs: Any
) -> str:
    """circuitsvis ``colored_tokens`` of per-token values, as offline HTML."""
    import circuitsvis.tokens

    vals = torch.as_tensor(values, dtype=torch.float32).flatten().tolist()
    if len(vals) != len(labels):
        raise ValueError(f"colored_tokens_html: {len(labels)} labels but {len(vals)} values")
    return offline_html(
        circuitsvis.tokens.colored_tokens(tokens=list(labels), values=vals, **kwargs)
    )


def patching_tokens_html(
    result: Any,
    labels: Sequence[str],
    *,
    head: int | None = None,
    layers: Sequence[int] | None = None,
    example: int | None = None,
) -> str:
    """Coloured-token view of a by-position :class:`~probes.patching.PatchResult`, as offline HTML.

    One series per layer (and per head for head sites, or only ``head``), each colouring the
    tokens by the patching effect at that position; circuitsvis' ``colored_tokens_multi`` shows
    one series at a time (buttons) and all values on hover. One widget, so the 1.3 MB bundle is
    inlined once. A single series uses ``colored_tokens`` (symmetric colour scale).

    ``example``: show that example's per-example values (whose positions match ``labels``)
    instead of the mean over examples."""
    if not result.by_position:
        raise ValueError("patching_tokens_html needs a by-position result (by_position=True)")
    axes = result.axis_names
    if example is None:
        vals = result.values.detach().float().cpu()
    else:
        if result.per_example is None:
            raise ValueError("patching_tokens_html: this result has no per-example values")
        vals = result.per_example[..., example].detach().float().cpu()
    series: list[tuple[str, Tensor]] = []
    for li, layer in enumerate(result.layers):
        if layers is not None and layer not in layers:
            continue
        v = vals[li]
        if axes == ("layer", "pos", "head"):
            series += [
                (f"L{layer}H{h}", v[:, h]) for h in (range(v.shape[1]) if head is None else [head])
            ]
        elif axes == ("layer", "head", "dest_pos"):
            series += [
                (f"L{layer}H{h} dest", v[h])
                for h in (range(v.shape[0]) if head is None else [head])
            ]
        else:
            series.append((f"L{layer}", v))
    if not series:
        raise ValueError("patching_tokens_html: nothing selected")
    for name, row in series:
        if row.shape[0] != len(labels):
            raise ValueError(
                f"patching_tokens_html: {len(labels)} labels but {row.shape[0]} positions ({name})"
            )
    if len(series) == 1:
        vmax = float(series[0][1].abs().max()) or 1.0
        return colored_tokens_html(labels, series[0][1], min_value=-vmax, max_value=vmax)
    import circuitsvis.tokens

    values = torch.stack([row for _, row in series], dim=1)  # [pos, series]
    return offline_html(
        circuitsvis.tokens.colored_tokens_multi(list(labels), values, [n for n, _ in series])
    )


def attention_html(
    model,
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
    """circuitsvis ``attention_heads`` of stored :class:`~probes.patterns.AttentionPatterns` (all
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


# ---------------------------------------------------------------------------------------------
# matplotlib figures
# ---------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_patching(result: Any, path: str | Path, *, title: str | None = None) -> list[Path]:
    """Heatmap(s) of a :class:`~probes.patching.PatchResult`: one figure for 1-2-D grids; for
    3-D grids (by-position head sites) one panel per layer. Returns the written paths."""
    plt = _plt()
    vals = result.values.detach().float().cpu()
    axes = result.axis_names
    vmax = float(vals.abs().max()) or 1.0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = title or f"patching {result.site} ({result.direction}, {result.metric_name})"
    if vals.ndim == 1:
        vals = vals[:, None]
        axes = (*axes, "")
    if vals.ndim == 2:
        fig, ax = plt.subplots(
            figsize=(max(4, 0.35 * vals.shape[1] + 2), max(2.5, 0.4 * vals.shape[0] + 1.5))
        )
        im = ax.imshow(vals.numpy(), cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_xlabel(axes[1])
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(result.layers)), [str(layer) for layer in result.layers])
        fig.colorbar(im, ax=ax)
        ax.set_title(title, fontsize=9)
    else:
        n = vals.shape[0]
        fig, axs = plt.subplots(
            n, 1, figsize=(max(5, 0.08 * vals.shape[1] + 3), 2.0 * n + 1), squeeze=False
        )
        for li in range(n):
            ax = axs[li, 0]
            grid = vals[li] if axes[1] == "head" else vals[li].T  # rows: heads
            if axes[1] == "head":
                xlab = axes[2]
            else:
                xlab = axes[1]
            im = ax.imshow(
                grid.numpy(),
                cmap="RdBu",
                vmin=-vmax,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_ylabel(f"L{result.layers[li]} head")
            ax.set_xlabel(xlab)
            fig.colorbar(im, ax=ax)
        axs[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def _real_extent(terms: Any) -> int:
    """Number of leading positions to show: up to the last real query."""
    idx = terms.query_valid.nonzero()
    return int(idx.max()) + 1 if idx.numel() else terms.actual.shape[0]


def plot_logit_terms(terms: Any, path: str | Path, *, grouped: bool = False) -> Path:
    """One heatmap per term of a :class:`~probes.decomposition.LogitTerms`, plus the sum and the
    actual logits, on a shared colour scale (masked entries hatched out)."""
    plt = _plt()
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
    plt = _plt()
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


__all__ = [
    "attention_html",
    "colored_tokens_html",
    "offline_html",
    "patching_tokens_html",
    "patterns_html",
    "plot_logit_terms",
    "plot_patching",
    "plot_rope_terms",
    "save_html",
    "token_labels",
]

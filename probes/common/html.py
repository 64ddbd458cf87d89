"""Offline circuitsvis HTML.

circuitsvis' ``RenderedHTML`` has two forms: ``str(html)`` loads the JavaScript bundle from a CDN
(blank without network), ``html.local_src`` inlines it (about 1.3 MB) and works offline. Everything
here writes ``local_src``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pe_interp.util.io import atomic_write_text


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

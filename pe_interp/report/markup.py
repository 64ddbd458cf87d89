"""The two bits of HTML every report section uses: inline Markdown and an image tag."""

from __future__ import annotations

import html
import re


def inline_md(text: str) -> str:
    """Escape, then the two bits of Markdown the tables use: **bold** and `code`."""
    out = html.escape(str(text))
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def img(uri: str | None, alt: str) -> str:
    if not uri:
        return f"<p class='note'>({html.escape(alt)}: nothing to plot)</p>"
    return f"<img alt='{html.escape(alt)}' src='{uri}'>"


__all__ = ["img", "inline_md"]

"""circuitsvis widgets in one offline HTML file, with the JavaScript bundle inlined **once**.

``circuitsvis`` gives each widget a ``local_src`` of the form::

    <div id="circuits-vis-XXXX" style="..."/>
    <script crossorigin type="module">
    "use strict";var CircuitsVis=(()=>{ ... ~1.3 MB ... })();
    //# sourceMappingURL=iife.js.map
    CircuitsVis.render("circuits-vis-XXXX", CircuitsVis.AttentionHeads, {...props...})
    </script>

Pasting that per widget would repeat the 1.3 MB bundle each time. :class:`InlineWidgets` splits
``local_src`` at the last ``CircuitsVis.render(``: the part before it is the bundle, kept once (from
the first widget) in its own module script that also publishes ``window.CircuitsVis``; every
widget then gets only its ``<div>`` and a small module script with its ``CircuitsVis.render(...)``
call. Module scripts run in document order, so the bundle runs before any widget's call. The
source-map comment is dropped (the map is not shipped and devtools would try to fetch it).

If the output does not have that shape (a different circuitsvis version), :meth:`InlineWidgets.add`
returns None and :attr:`InlineWidgets.error` says why; the report then falls back to static
images with a visible message.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field

RENDER_CALL = "CircuitsVis.render("
_SHAPE = re.compile(
    r"^\s*<div\s+id=\"(?P<id>[^\"]+)\"[^>]*>\s*(?:</div>\s*)?<script(?P<attrs>[^>]*)>(?P<body>.*)</script>\s*$",
    re.S,
)
_SOURCEMAP = re.compile(r"^\s*//# sourceMappingURL=.*$", re.M)


class WidgetFormatError(ValueError):
    """``local_src`` is not shaped as this module expects."""


@dataclass(frozen=True)
class SplitWidget:
    div_id: str
    bundle: str
    call: str


def split_local_src(src: str) -> SplitWidget:
    """Split one widget's ``local_src`` into its div id, the bundle and its render call."""
    m = _SHAPE.match(src)
    if not m:
        raise WidgetFormatError("local_src is not one <div id=...> followed by one <script>")
    body = m.group("body")
    i = body.rfind(RENDER_CALL)
    if i < 0:
        raise WidgetFormatError(f"no {RENDER_CALL!r} call in the widget script")
    bundle, call = body[:i], body[i:].strip()
    if "CircuitsVis=" not in bundle.replace(" ", ""):
        raise WidgetFormatError("the widget script does not define CircuitsVis before rendering")
    if m.group("id") not in call:
        raise WidgetFormatError("the render call does not target the widget's div")
    if "</script" in bundle.lower() or "</script" in call.lower():
        raise WidgetFormatError("the script text contains '</script'")
    return SplitWidget(m.group("id"), _SOURCEMAP.sub("", bundle).strip(), call)


def _round(x, decimals: int):
    if isinstance(x, float):
        return round(x, decimals)
    if isinstance(x, list):
        return [_round(v, decimals) for v in x]
    if isinstance(x, dict):
        return {k: _round(v, decimals) for k, v in x.items()}
    return x


def rewrite_props(call: str, decimals: int | None = None, extra: dict | None = None) -> str:
    """Round the floats in a render call's JSON props (``0.1234567835`` → ``0.123``) and/or set
    some props (``extra``). The props are the call's last argument, from its first ``{`` to its
    last ``}``; a call that does not parse that way is returned unchanged."""
    i, j = call.find("{"), call.rfind("}")
    if i < 0 or j < i:
        return call
    try:
        props = json.loads(call[i : j + 1])
    except json.JSONDecodeError:
        return call
    if decimals is not None:
        props = _round(props, decimals)
    props.update(extra or {})
    return call[:i] + json.dumps(props, separators=(",", ":")) + call[j + 1 :]


@dataclass
class InlineWidgets:
    """Collects circuitsvis widgets; the bundle goes into the page once (see the module docs)."""

    bundle: str | None = None
    error: str | None = None
    count: int = 0
    _ids: set[str] = field(default_factory=set)

    def add(self, rendered, decimals: int | None = 3, props: dict | None = None) -> str | None:
        """HTML for one widget (a circuitsvis ``RenderedHTML`` or its ``local_src`` string), or
        None if it cannot be inlined. ``decimals`` rounds the numbers in the widget's props (the
        attention weights), which keeps pages with many widgets small; ``props`` overrides props
        (e.g. ``{"maskUpperTri": False}`` for bidirectional attention)."""
        if self.error:
            return None
        try:
            src = rendered if isinstance(rendered, str) else rendered.local_src
            part = split_local_src(src)
        except (AttributeError, WidgetFormatError) as err:
            self.error = f"{type(err).__name__}: {err}"
            return None
        if self.bundle is None:
            self.bundle = part.bundle
        if part.div_id in self._ids:
            self.error = f"duplicate widget id {part.div_id}"
            return None
        self._ids.add(part.div_id)
        self.count += 1
        call = (
            part.call
            if decimals is None and not props
            else rewrite_props(part.call, decimals, props)
        )
        return (
            f'<div id="{html.escape(part.div_id)}" class="cv-widget" style="margin: 15px 0;"></div>\n'
            f'<script type="module">\n{call}\n</script>\n'
        )

    def bundle_html(self) -> str:
        """The one script that loads the bundle (empty if no widget was added)."""
        if self.bundle is None:
            return ""
        return (
            '<script type="module" id="circuitsvis-bundle">\n'
            f"{self.bundle}\n"
            "window.CircuitsVis = CircuitsVis;\n"
            "</script>\n"
        )

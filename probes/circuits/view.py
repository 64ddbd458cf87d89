"""A circuit as a self-contained SVG graph: nodes laid out by layer (networkx's
``multipartite_layout``), edges coloured by their positional against content share and as wide
as their score, a position-aware circuit's edges one per span, side by side and dashed by span,
the numbers on hover. A grouped model's key/value head is a node of its own (``"L1KV0"``: the k and
v inputs its group of query heads shares; in the ungrouped view each query head takes its own k and v
edges, as in a model without grouping). No external script, style or font: it works offline, in a
notebook (``IPython.display.HTML(circuit_html(c))``), in ``report.html`` and as a page of its own
(:func:`circuit_page`).

networkx does the layout; the SVG is written here because no installed renderer draws a layered
graph with hover text offline (graphviz is not installed; pyvis and d3 load scripts from the
network; circuitsvis has no graph view).
"""

from __future__ import annotations

import html
import itertools
from collections import Counter
from typing import Any

import networkx as nx
import numpy as np

from probes.circuits.graph import node_layer, parse

POSITION, CONTENT = (33, 102, 172), (230, 97, 1)  # blue, orange
POSITIVE, NEGATIVE = (178, 24, 43), (33, 102, 172)
PORTS = {"q": -9.0, "k": 0.0, "v": 9.0}
DASHES = ("", "6,3", "2,3", "8,3,2,3", "1,2", "10,5")  # one per span of a position-aware circuit
_ids = itertools.count()

STYLE = """
.pe-circuit { font-family: system-ui, sans-serif; font-size: 12px; position: relative; }
.pe-circuit svg { background: #fff; border: 1px solid #ddd; }
.pe-circuit .node circle { stroke: #333; stroke-width: 1.2px; }
.pe-circuit .node.top circle { stroke: #000; stroke-width: 3px; }
.pe-circuit .edge { fill: none; stroke-linecap: round; opacity: 0.85; }
.pe-circuit .edge:hover, .pe-circuit .node:hover circle { opacity: 1; stroke: #000; }
.pe-circuit .tip { position: absolute; display: none; pointer-events: none; background: #222; color: #fff;
                   padding: 4px 7px; border-radius: 4px; white-space: pre; font-size: 12px; z-index: 10; }
.pe-circuit .legend span { display: inline-block; width: 28px; height: 8px; margin: 0 4px 0 10px; }
"""

SCRIPT = """
(function () {
  var root = document.getElementById(%s);
  if (!root) return;
  var tip = root.querySelector('.tip');
  root.querySelectorAll('[data-tip]').forEach(function (el) {
    el.addEventListener('mouseover', function (e) {
      tip.textContent = el.getAttribute('data-tip'); tip.style.display = 'block';
      var r = root.getBoundingClientRect();
      tip.style.left = ((e.clientX || r.left) - r.left + 12) + 'px';
      tip.style.top = ((e.clientY || r.top) - r.top + 12) + 'px';
    });
    el.addEventListener('mouseout', function () { tip.style.display = 'none'; });
  });
})();
"""


def _mix(a: tuple, b: tuple, t: float) -> str:
    return "rgb({},{},{})".format(*(round(x + (y - x) * t) for x, y in zip(a, b)))


def _rank(name: str, n_layers: int) -> int:
    d = node_layer(name, n_layers)
    return int(round(2 * d + 2))  # embed 0, layer-l heads 2l+2, MLP l 2l+3, readout 2L+2


def layout(
    nodes: list[str], n_layers: int, width: float, height: float, margin: float = 40.0
) -> dict[str, tuple[float, float]]:
    """Pixel positions: one row per layer (embedding at the bottom, the readout at the top)."""
    g = nx.Graph()
    for n in nodes:
        g.add_node(n, layer=_rank(n, n_layers))
    pos = nx.multipartite_layout(g, subset_key="layer", align="horizontal", scale=1.0)
    if not nodes:
        return {}
    xy = np.array([pos[n] for n in nodes], dtype=np.float64)
    # networkx spaces each row evenly; put a row's nodes in head order along it
    for rank in {_rank(n, n_layers) for n in nodes}:
        idx = [i for i, n in enumerate(nodes) if _rank(n, n_layers) == rank]
        by_name = sorted(idx, key=lambda i: (parse(nodes[i]).head or 0, nodes[i]))
        xs = sorted(xy[idx, 0])
        for i, x in zip(by_name, xs):
            xy[i, 0] = x
    lo, hi = xy.min(0), xy.max(0)
    out = {}
    for n, (x, y) in zip(nodes, xy):
        fx = (x - lo[0]) / (hi[0] - lo[0]) if hi[0] > lo[0] else 0.5
        fy = (y - lo[1]) / (hi[1] - lo[1]) if hi[1] > lo[1] else 0.5
        out[n] = (margin + fx * (width - 2 * margin), height - margin - fy * (height - 2 * margin))
    return out


def circuit_svg(
    c: Any,
    *,
    width: int = 900,
    height: int = 520,
    highlight: str | None = None,
    families: tuple[str, str] = ("position", "content"),
) -> str:
    """The SVG of a :class:`~probes.Circuit` (see the module docstring). With scores of both
    ``families`` an edge's colour runs from content (orange) to position (blue) by
    ``|position| / (|position| + |content|)``; with one score, red is positive and blue negative.
    Width is ``|score|`` (summed over the families) relative to the largest."""
    pos_fam, con_fam = families
    two = pos_fam in c.scores and con_fam in c.scores
    mag = (
        np.abs(c.scores[pos_fam]) + np.abs(c.scores[con_fam])
        if two
        else np.abs(next(iter(c.scores.values())))
    )
    top = float(np.nanmax(mag)) if len(mag) else 1.0
    nodes = list(c.nodes)
    xy = layout(nodes, c.n_layers, width, height)
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}'>"
    ]
    order = np.argsort(mag, kind="stable")  # thin edges first, so wide ones are on top
    spans = getattr(c, "spans", None)
    names = tuple(getattr(c, "span_names", ()) or ())
    for i in order:
        w, r = c.edges[i]
        x0, y0 = xy[w]
        x1, y1 = xy[r.split(".")[0]]
        comp = parse(r).component
        x1 += PORTS.get(comp, 0.0)
        dash = ""
        if spans is not None:  # one path per span, side by side, dashed by span
            k = names.index(spans[i])
            x0 += 2.5 * (k - (len(names) - 1) / 2)
            x1 += 1.5 * (k - (len(names) - 1) / 2)
            dash = (
                f" stroke-dasharray='{DASHES[k % len(DASHES)]}'" if DASHES[k % len(DASHES)] else ""
            )
        y0, y1 = y0 - 9, y1 + 9
        scores = {k: float(v[i]) for k, v in c.scores.items()}
        head = f"{w} -> {r}" + ("" if spans is None else f" @ {spans[i]}")
        if two:
            share = abs(scores[pos_fam]) / (abs(scores[pos_fam]) + abs(scores[con_fam]) or 1.0)
            color = _mix(CONTENT, POSITION, share)
            tip = f"{head}\n{pos_fam}: {scores[pos_fam]:+.4f}\n{con_fam}: {scores[con_fam]:+.4f}\n{pos_fam} share: {share:.2f}"
        else:
            ((name, v),) = scores.items()
            color = _mix((255, 255, 255), POSITIVE if v >= 0 else NEGATIVE, 0.9)
            tip = f"{head}\n{name}: {v:+.4f}"
        tip += "".join(f"\n{k}: {v:+.4f}" for k, v in scores.items() if two and k not in families)
        stroke = 1.0 + 8.0 * float(mag[i]) / (top or 1.0)
        dy = (y1 - y0) / 2
        d = f"M{x0:.1f},{y0:.1f} C{x0:.1f},{y0 + dy:.1f} {x1:.1f},{y1 - dy:.1f} {x1:.1f},{y1:.1f}"
        esc = html.escape(tip, quote=True)
        parts.append(
            f"<path class='edge' d='{d}' stroke='{color}' stroke-width='{stroke:.2f}'{dash} data-tip='{esc}'>"
            f"<title>{html.escape(tip)}</title></path>"
        )
    parts += _node_marks(c, nodes, xy, mag, highlight)
    parts.append("</svg>")
    return "".join(parts)


def _node_marks(c: Any, nodes: list[str], xy: dict, mag: np.ndarray, highlight: str | None) -> list:
    """Each node's circle and name, its tip the score of the edges into it."""
    incoming: dict[str, float] = {}
    for (_, r), m in zip(c.edges, mag):
        incoming[r.split(".")[0]] = incoming.get(r.split(".")[0], 0.0) + float(m)
    parts = []
    for n in nodes:
        x, y = xy[n]
        kind = parse(n).kind
        fill = {  # kv: a grouped model's key/value head, whose k and v readers its group shares
            "embed": "#e0e0e0",
            "head": "#fff7bc",
            "kv": "#fdd0a2",
            "mlp": "#c7e9c0",
            "logits": "#d9d9d9",
        }[kind]
        tip = f"{n}\nscore into it: {incoming.get(n, 0.0):.4f}"
        cls = "node top" if n == highlight else "node"
        parts.append(
            f"<g class='{cls}' data-tip='{html.escape(tip, quote=True)}'><title>{html.escape(tip)}</title>"
            f"<circle cx='{x:.1f}' cy='{y:.1f}' r='9' fill='{fill}'/>"
            f"<text x='{x:.1f}' y='{y - 13:.1f}' text-anchor='middle'>{html.escape(n)}</text></g>"
        )
    return parts


def circuit_summary(c: Any) -> str:
    """What the circuit is and how faithful, in one line (the CLI's, the report's, the page's)."""
    f = c.faithfulness or {}
    kind = "position-aware edges (edge x span)" if c.positional else "edges"
    view = "; k/v readers per query head" if getattr(c, "kv_view", "") == "ungrouped" else ""
    share = len(c.edges) / c.total_edges if c.total_edges else float("nan")
    sel = c.meta.get("selection", {})
    what = (
        f"the smallest circuit with faithfulness >= {f['target']:g}"
        if "target" in f
        else f"the first {sel.get('top_n')} by the {sel.get('select', 'top')} order"
    )
    kept = f.get("kept")
    fam = c.meta.get("counterfactual")
    pairs = (
        f"{f['n_pairs']} held-out {fam + ' ' if fam else ''}pairs"
        if "n_pairs" in f
        else "its pairs"
    )
    faith = "" if kept is None else f", faithfulness {kept:.3f} on {pairs}"
    return f"{what}: {len(c.edges)} of {c.total_edges} {kind} ({share:.1%}){faith}{view}"


def span_counts(c: Any) -> str:
    """How many kept edges sit at each span (empty when the circuit is not position-aware)."""
    if not c.positional:
        return ""
    counts = Counter(c.spans)
    return ", ".join(f"{s} {counts[s]}" for s in c.span_names if counts.get(s))


def _dash_sample(k: int) -> str:
    dash = DASHES[k % len(DASHES)]
    style = f" stroke-dasharray='{dash}'" if dash else ""
    return f"<svg width='34' height='8'><line x1='2' y1='4' x2='32' y2='4' stroke='#555' stroke-width='2'{style}/></svg>"


def circuit_html(c: Any, *, title: str = "", **kwargs: Any) -> str:
    """The graph with its legend, tooltip and style: a fragment to embed anywhere."""
    uid = f"pe-circuit-{next(_ids)}"
    two = all(f in c.scores for f in kwargs.get("families", ("position", "content")))
    if two:
        legend = (
            f"<span style='background:{_mix(CONTENT, POSITION, 0)}'></span>content"
            f"<span style='background:{_mix(CONTENT, POSITION, 0.5)}'></span>both"
            f"<span style='background:{_mix(CONTENT, POSITION, 1)}'></span>position"
        )
    else:
        legend = (
            f"<span style='background:{_mix((255, 255, 255), POSITIVE, 0.9)}'></span>positive"
            f"<span style='background:{_mix((255, 255, 255), NEGATIVE, 0.9)}'></span>negative"
        )
    spans = getattr(c, "spans", None)
    if spans is not None:  # which dash is which span
        legend += "<br>" + "".join(
            f"{_dash_sample(k)}{html.escape(name)} "
            for k, name in enumerate(c.span_names)
            if name in spans
        )
    head = f"<p><b>{html.escape(title)}</b></p>" if title else ""
    kind = "position-aware edges (edge x span)" if spans is not None else "edges"
    faith = (c.faithfulness or {}).get("kept")
    note = (
        f"{len(c.edges)} of {c.total_edges} {kind} ({html.escape(c.method)}, metric {html.escape(c.metric)})"
        + ("" if faith is None else f", faithfulness {faith:.3f}")
        + "; width: |score|; q, k, v enter a head left, middle, right; hover for the numbers"
    )
    return (
        f"<div class='pe-circuit' id='{uid}'><style>{STYLE}</style>{head}"
        f"<div class='legend'>{legend}</div>{circuit_svg(c, **kwargs)}<div class='tip'></div>"
        f"<p style='color:#555'>{note}</p><script>{SCRIPT % repr(uid)}</script></div>"
    )


def circuit_page(c: Any, *, title: str = "circuit", body: str = "", **kwargs: Any) -> str:
    """A whole offline HTML page: the graph, then ``body`` (already HTML)."""
    t = html.escape(title)
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{t}</title></head>"
        f"<body style='margin:16px 28px;font-family:system-ui,sans-serif'><h1>{t}</h1>"
        f"{circuit_html(c, **kwargs)}{body}</body></html>\n"
    )


__all__ = [
    "circuit_html",
    "circuit_page",
    "circuit_summary",
    "circuit_svg",
    "layout",
    "span_counts",
]

"""The report's circuits section: each run's ``circuit.json`` (written by ``pe-interp circuit``)
as the offline graph of :mod:`probes.circuits.view`, with its size, its measured faithfulness,
its edges per span and the route into its top head."""

from __future__ import annotations

import html
from typing import Any

from probes.circuits import Circuit
from probes.circuits.view import circuit_html, circuit_summary, span_counts

MAX_MODELS = 12


def _load(cell: Any) -> Circuit | None:
    path = cell.run_dir / "circuit.json"
    try:
        return Circuit.load(path) if path.is_file() else None
    except (ValueError, KeyError):
        return None


def _route_line(c: Circuit) -> str:
    route = c.meta.get("route") or {}
    parts = []
    for kind, comps in route.get("exact", {}).items():
        best = max(
            ((abs(v), comp, s, v) for comp, ss in comps.items() for s, v in ss.items()),
            default=None,
        )
        if best:
            parts.append(f"{kind}: largest {best[2]} → {best[1]} ({best[3]:+.3f})")
    return "; ".join(parts)


def circuits_section(cells: list) -> str:
    """One graph per model that has a ``circuit.json`` (lowest seed of each model and task)."""
    seen, parts = set(), []
    for cell in sorted(cells, key=lambda c: (c.label, c.task, c.seed)):
        if (cell.label, cell.task) in seen or len(parts) >= MAX_MODELS:
            continue
        c = _load(cell)
        if c is None:
            continue
        seen.add((cell.label, cell.task))
        top = c.meta.get("top_head", "")
        title = f"{cell.label} · {cell.task} · seed {cell.seed}: top head {top}"
        parts.append(circuit_html(c, title=title, highlight=top, width=860, height=420))
        spans = f"; kept per span: {span_counts(c)}" if c.positional else ""
        parts.append(
            f"<p class='note'>{html.escape(circuit_summary(c) + spans)}. Exact path patching into "
            f"{html.escape(top)}: {html.escape(_route_line(c))}</p>"
        )
    if not parts:
        return (
            "<p class='note'>No circuits in these runs: <code>pe-interp circuit RUN_DIR</code> writes "
            "<code>circuit.json</code> into a run directory, and this section shows it.</p>"
        )
    return (
        "<p class='note'>Edges of the residual-stream graph scored on position-only and content-only "
        "counterfactuals, each kept edge on a path from the embedding to the logits; a position-aware circuit "
        "keeps an edge per span of the examples (dashes: the span; colour: the positional share; width: the "
        "score; hover for the numbers).</p>" + "".join(parts)
    )


__all__ = ["circuits_section"]

"""The survey's circuit section (``pe-interp survey``'s ``circuit`` step,
:mod:`pe_interp.commands.survey_circuit`), from its digest alone: what the circuit is and how
faithful on held-out pairs, the measured faithfulness curve, its units per span, its first units
and what reads the head of the largest route share."""

from __future__ import annotations

from typing import Any

__all__ = ["circuit_column", "circuit_section"]

SHOWN = 10  # rows of each table


def _unit(row: list[Any]) -> str:
    w, r, span = row[:3]
    return f"{w} → {r}" + (f" @ {span}" if span else "")


def circuit_section(step: dict[str, Any]) -> list[str]:
    res = step["result"]
    f, meta = res["faithfulness"], res["meta"]
    total = res["total_edges"]
    lines = [
        f"{step['line']}.",
        "",
        f"Edges scored by attribution patching (`{res['method']}`) on {meta['n_pairs']} position-only "
        f"pairs, σ-aligned: each token compared with itself at its moved position, so a unit blind "
        f"to position scores 0; ranked by |position score| (not connected). The size is searched "
        f"on held-out pairs (seed {meta['held_out_seed']}), where the faithfulness is also measured "
        f"({f['forwards']} circuits measured; faithfulness need not grow with size):",
        "",
        "| units kept | of the graph | recovered |",
        "|---|---|---|",
    ]
    for size, rec in zip(f["kept_sizes"], f["recovered"], strict=True):
        lines.append(f"| {size:,} | {100 * size / total:.2f}% | {rec:+.3f} |")
    counts = ", ".join(
        f"{s} {res['span_counts'][s]:,}" for s in res["span_names"] if s in res["span_counts"]
    )
    lines += ["", f"Units kept per span: {counts or 'none'}.", ""]
    lines += [f"The first {SHOWN} units of the ranking (scores in logits of the margin):", ""]
    lines += ["| rank | unit | position | content |", "|---|---|---|---|"]
    for i, row in enumerate(res["top_edges"][:SHOWN], 1):
        lines.append(f"| {i} | {_unit(row)} | {row[3]:+.3f} | {row[4]:+.3f} |")
    head = meta["top_head"]
    reads = res["readers_of_route_head"][:SHOWN]
    lines += [
        "",
        f"What reads {head} ({meta['top_head_source']}) in the circuit, first {len(reads)}:",
        "",
    ]
    if reads:
        lines += ["| rank | unit | position | content |", "|---|---|---|---|"]
        lines += [f"| {r[0]} | {_unit(r[1:])} | {r[4]:+.3f} | {r[5]:+.3f} |" for r in reads]
    else:
        lines.append(f"No unit of the circuit reads {head}.")
    return lines


def circuit_column(step: dict[str, Any] | None, head: str) -> str | None:
    """The heads table's cell: the rank of the head's first unit in the circuit and its units
    out and in (None where no circuit step ran)."""
    if step is None:
        return None
    got = step["result"]["heads"].get(head)
    if not got or not got["out"]:
        return "none out" + (f", {got['in']} in" if got else "")
    return f"#{got['first']:,} ({got['out']:,} out, {got['in']:,} in)"

"""The tables of ``circuit.html`` under the circuit's graph (``pe-interp circuit``): the exact
route into the top head beside its attribution estimate, a layer-0 head's logit terms, and the
faithfulness curve.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["body_html"]


def _num(x: Any) -> str:
    return "" if x is None else f"{x:+.3f}"


def _cell(v: float | None) -> str:
    """A table cell: three decimals, or a dash where nothing was measured (NaN is saved as null)."""
    return "–" if v is None or v != v else f"{v:.3f}"


def body_html(c) -> str:
    """The tables under the graph: the route into the top head, layer-0 terms, the curve."""
    from probes.circuits.view import circuit_summary, span_counts

    route, f = c.meta["route"], c.faithfulness
    rows = []
    for kind, comps in route["exact"].items():
        for comp, senders in comps.items():
            for s, v in sorted(senders.items(), key=lambda kv: -abs(kv[1]))[:6]:
                est = route.get("estimate", {}).get(kind, {}).get(comp, {}).get(s)
                rows.append(
                    f"<tr><td>{kind}</td><td>{comp}</td><td>{html.escape(s)}</td><td>{_num(v)}</td><td>{_num(est)}</td></tr>"
                )
    parts = [
        f"<p><b>{html.escape(circuit_summary(c))}</b>"
        + (f"; kept per span: {html.escape(span_counts(c))}" if c.positional else "")
        + "</p>",
        f"<h2>Into {html.escape(c.meta['top_head'])} ({html.escape(c.meta['top_head_source'])})</h2>",
        "<p>Exact path patching of each writer into the head's query, key and value input alone (clean into "
        f"corrupt, metric {html.escape(route['metric'])}), under each counterfactual family; the attribution "
        f"estimate of the same edge beside it. Metric gaps m(clean) − m(corrupt): "
        + ", ".join(f"{k} {v:+.3f}" for k, v in route["gaps"].items())
        + ".</p>",
        "<table border='1' cellpadding='3' style='border-collapse:collapse'><tr><th>family</th><th>input</th>"
        "<th>from</th><th>exact</th><th>estimate</th></tr>" + "".join(rows) + "</table>",
    ]
    if route.get("layer0"):
        l0 = route["layer0"]
        cells = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{_cell(v)}</td><td>{_cell(l0['toeplitz'].get(k))}</td></tr>"
            for k, v in l0["variance_share"].items()
        )
        parts.append(
            "<h3>Layer-0 logit terms (probes.logit_terms, mean over "
            f"{l0['n_examples']} examples)</h3><table border='1' cellpadding='3' style='border-collapse:collapse'>"
            f"<tr><th>term</th><th>variance share</th><th>Toeplitz</th></tr>{cells}</table>"
        )
    kept = f.get("kept_sizes") or f.get("kept")
    kept = kept if isinstance(kept, list) else f["sizes"]
    pts = "".join(
        f"<tr><td>{k}</td><td>{m:+.3f}</td><td>{r:.3f}</td></tr>"
        for k, m, r in zip(kept, f["metric"], f["recovered"])
    )
    parts.append(
        f"<h2>Faithfulness (held-out {html.escape(c.meta['counterfactual'])} pairs, other edges take the corrupt "
        f"run's values)</h2><p>clean {f['full']:+.3f}, nothing kept {f['empty']:+.3f}, area under the curve "
        f"{f.get('area', float('nan')):.3f}</p><table border='1' cellpadding='3' "
        f"style='border-collapse:collapse'><tr><th>edges kept</th><th>metric</th><th>recovered</th></tr>{pts}</table>"
    )
    return "".join(parts)

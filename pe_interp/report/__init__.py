"""The reproduction report: ``summary.md`` / ``summary.json`` and a self-contained ``report.html``.

``write_report(out_dir, preset)`` reads a reproduce directory (``grid.json``, ``cells/*/result.json``,
the run directories) and writes the three files into it. See :mod:`pe_interp.report.summary` for
the tables and :mod:`pe_interp.report.claims` for the criteria behind each claim's verdict.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pe_interp.checkpoint import atomic_write_bytes


def json_safe(x):
    """``x`` with NaN/inf floats replaced by None (strict JSON), tuples as lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def write_report(out_dir: str | Path, preset: str = "quick") -> None:
    """Write ``summary.md``, ``summary.json`` and ``report.html`` into ``out_dir``."""
    from pe_interp.report.data import load_cells
    from pe_interp.report.gradients import gradient_evidence
    from pe_interp.report.html import render_html
    from pe_interp.report.summary import build_summary

    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir}: reproduce directory not found")
    cells, errors = load_cells(out_dir)
    gradients = gradient_evidence(cells, out_dir)
    summary = build_summary(out_dir, preset, gradients=gradients, cells=cells, errors=errors)
    atomic_write_bytes(out_dir / "summary.md", summary.markdown().encode())
    data = json_safe(summary.to_dict())
    atomic_write_bytes(out_dir / "summary.json", (json.dumps(data, indent=1, allow_nan=False) + "\n").encode())
    atomic_write_bytes(out_dir / "report.html", render_html(summary).encode())


__all__ = ["write_report"]

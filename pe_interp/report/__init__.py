"""The reproduction report: ``summary.md`` / ``summary.json`` and a self-contained ``report.html``.

``write_report(out_dir, preset)`` reads a reproduce directory (``grid.json``, ``cells/*/result.json``,
the files the sweep's probes stored in the run directories, ``gradients.json``) and writes the
three files into it. It computes nothing about a model: every number is read back with the probe
result's own ``load``/``from_dict``. See :mod:`pe_interp.report.summary` for the tables and
:mod:`pe_interp.report.claims` for the criteria behind each claim's verdict.
"""

from __future__ import annotations

from pathlib import Path

from pe_interp.report.data import load_cells
from pe_interp.report.generalization import (
    concentration_table,
    generalization_tables,
    link_table,
    load_points,
    points_from,
)
from pe_interp.report.gradients import gradient_evidence
from pe_interp.report.html import render_html
from pe_interp.report.study import is_study, study_table
from pe_interp.report.summary import build_summary
from pe_interp.util.io import atomic_write_json, atomic_write_text


def write_report(
    out_dir: str | Path,
    preset: str = "quick",
    title: str | None = None,
    link_with: dict[str, str | Path] | None = None,
) -> Path:
    """Write ``summary.md``, ``summary.json`` and ``report.html`` into ``out_dir``; returns the
    path of ``report.html``. Where runs stored ``generalization.json``, the length-generalisation
    tables, the concentration table and their link are added; ``link_with`` (``{source: sweep
    directory}``) adds other sweeps' models to those three (e.g. the ``mid`` study's)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir}: reproduce directory not found")
    cells, errors = load_cells(out_dir)
    summary = build_summary(
        out_dir, preset, gradients=gradient_evidence(out_dir), cells=cells, errors=errors
    )
    if is_study(out_dir):  # a grid of one-factor variants: the study table, by condition
        summary.tables["study"] = study_table(out_dir)
    points = load_points(cells, preset) + points_from(link_with or {})
    if any(p.gen is not None for p in points):  # issue 23: generalisation and concentration
        for table in generalization_tables(points):
            summary.tables[table.key] = table
        summary.tables["concentration"] = concentration_table(points)
        summary.tables["link"] = link_table(points)
    atomic_write_text(out_dir / "summary.md", summary.markdown())
    atomic_write_json(out_dir / "summary.json", summary.to_dict(), indent=1, sort_keys=False)
    return atomic_write_text(out_dir / "report.html", render_html(summary, report_title=title))


__all__ = ["write_report"]

"""``report.html``: the summary tables and the figures in one self-contained, offline file.

Figures are PNG data URIs; the circuitsvis bundle is inlined once (:mod:`pe_interp.report.cvis`);
there are no external stylesheets, scripts, fonts or images, so the page loads without a network.
"""

from __future__ import annotations

import html
import re

import numpy as np

from pe_interp.report.attention import attention_section
from pe_interp.report.circuit import circuits_section
from pe_interp.report.cvis import InlineWidgets
from pe_interp.report.data import CellInfo, acc_stats, label_order, task_order
from pe_interp.report.figures import (
    accuracy_bars,
    common_vmax,
    grid_heatmap,
    model_dynamics,
    model_heatmap,
    model_layer_lines,
    rotary_task1_labels,
)
from pe_interp.report.markup import img, inline_md
from pe_interp.report.summary import SOURCE_NOTE, Summary, Table
from pe_interp.report.verdict import CSS as VERDICT_CSS
from pe_interp.report.verdict import decomposition_section, first_screen, first_task
from probes.decomposition.positional import DEFINITION

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 16px 28px; color: #222; line-height: 1.4; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
table { border-collapse: collapse; margin: 10px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; vertical-align: top; text-align: left; }
th { background: #f2f2f2; position: sticky; top: 0; }
tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
.status-reproduced { background: #d9f2d9 !important; font-weight: 600; }
.status-not-reproduced { background: #f8d7d7 !important; font-weight: 600; }
.status-not-measured { background: #eeeeee !important; font-weight: 600; }
.status-sanity-check { background: #dde8f6 !important; font-weight: 600; }
.note { color: #555; font-size: 13px; max-width: 1100px; }
.warn { color: #8a4b00; background: #fff4e0; padding: 6px 10px; border-left: 4px solid #e69500; }
.caption { color: #444; font-size: 13px; margin: 6px 0 0 0; }
img { max-width: 100%; }
nav a { margin-right: 14px; }
.figs { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-start; }
.figs img { max-width: 560px; }
.tok { display: inline-block; padding: 1px 3px; margin: 1px; border-radius: 3px; font-family: monospace; font-size: 12px; }
"""


def table_html(t: Table, status_col: str | None = None) -> str:
    head = "".join(f"<th>{inline_md(c)}</th>" for c in t.columns)
    rows = []
    si = t.columns.index(status_col) if status_col in t.columns else -1
    for row in t.rows:
        cells = []
        for i, x in enumerate(row):
            cls = ""
            if i == si:
                cls = (
                    " class='status-"
                    + re.sub(r"[^a-z]+", "-", x.replace("*", "").lower()).strip("-")
                    + "'"
                )
            cells.append(f"<td{cls}>{inline_md(x)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    notes = "".join(f"<p class='note'>{inline_md(n)}</p>" for n in t.notes)
    return (
        f"<h3>{inline_md(t.title)}</h3><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>{notes}"
    )


# ------------------------------------------------------------------------------------------------
# patching and positional scores
# ------------------------------------------------------------------------------------------------
def colored_tokens(values: np.ndarray, tokens: list[str] | None, title: str) -> str:
    v = np.nan_to_num(np.asarray(values, dtype=np.float64))
    lim = float(np.abs(v).max()) or 1.0
    spans = []
    for i, x in enumerate(v):
        a = min(1.0, abs(x) / lim)
        color = f"rgba(214,39,40,{a:.2f})" if x >= 0 else f"rgba(31,119,180,{a:.2f})"
        tok = tokens[i] if tokens and i < len(tokens) else f"p{i}"
        spans.append(
            f"<span class='tok' style='background:{color}' title='{x:.3f}'>{html.escape(str(tok))}</span>"
        )
    return f"<p class='caption'>{html.escape(title)}</p><div>{''.join(spans)}</div>"


def lowest_seeds(cells: list[CellInfo], has) -> list[CellInfo]:
    """The lowest-seed cell of each encoding × task for which ``has(cell)``, in table order."""
    order = {lab: i for i, lab in enumerate(label_order(cells))}
    out, seen = [], set()
    for c in sorted(cells, key=lambda c: (order.get(c.label, 99), c.task, c.seed)):
        if has(c) and (c.label, c.task) not in seen:
            seen.add((c.label, c.task))
            out.append(c)
    return out


def patching_section(cells: list[CellInfo]) -> str:
    parts = []
    for c in lowest_seeds(cells, lambda c: c.patching is not None):
        r = c.patching
        parts.append(f"<h3>{html.escape(c.label)} · {html.escape(c.task)} · seed {c.seed}</h3>")
        axes = list(r.axis_names)
        vals = r.values.double().numpy()
        layers = list(r.layers)
        desc = f"{r.site}: site {r.site}, {r.direction}, {r.metric_name}, {r.n_examples} pairs"
        if axes == ["layer", "head"]:
            parts.append(
                img(grid_heatmap(vals, desc, r.metric_name, center=True, yticks=layers), desc)
            )
        elif axes == ["layer", "pos", "head"]:
            for li, layer in enumerate(layers):
                row = vals[li]
                h = int(np.nanargmax(np.abs(np.nan_to_num(row)).max(0)))
                parts.append(
                    colored_tokens(
                        row[:, h], None, f"{desc}; layer {layer}, head {h} (largest), by position"
                    )
                )
        elif axes == ["layer", "pos"]:
            for li, layer in enumerate(layers):
                parts.append(colored_tokens(vals[li], None, f"{desc}; layer {layer}, by position"))
        elif axes == ["layer", "head", "dest_pos"]:
            parts.append(
                img(
                    grid_heatmap(
                        np.nanmean(vals, -1),
                        desc + " (mean over positions)",
                        r.metric_name,
                        center=True,
                    ),
                    desc,
                )
            )
        elif vals.ndim == 2:
            parts.append(
                img(grid_heatmap(vals, desc, r.metric_name, center=True, xlabel=axes[-1]), desc)
            )
    if not parts:
        return "<p class='note'>No patching results (patching runs on task-1 models with a rotary part).</p>"
    return (
        "<p class='note'>Activation patching with distance counterfactuals (lowest seed of each model): "
        "with the default normalised logit difference, 1 means patching the activation (clean into "
        "corrupt) fully restores the clean answer and 0 means no effect.</p>" + "".join(parts)
    )


def positional_section(cells: list[CellInfo]) -> str:
    parts = []
    for c in lowest_seeds(cells, lambda c: c.positional is not None):
        scores = c.positional.scores.double().numpy()
        title = f"{c.label} · {c.task} · seed {c.seed}: positional score per head"
        parts.append(
            img(
                grid_heatmap(scores, title, "position-only R²", cmap="viridis", vmin=0.0, vmax=1.0),
                title,
            )
        )
    if not parts:
        return ""
    return (
        f"<h3>Positional scores (lowest seed of each model)</h3><p class='note'>{html.escape(DEFINITION)}</p>"
        + "<div class='figs'>"
        + "".join(parts)
        + "</div>"
    )


def generalization_section(summary: Summary) -> str:
    """The length-generalisation tables, the concentration table, the link and its scatter."""
    from pe_interp.report.generalization import link_scatter

    tables = summary.tables
    out = "".join(table_html(t) for k, t in tables.items() if k.startswith("generalization-"))
    out += table_html(tables["concentration"]) + table_html(tables["link"])
    for task in dict.fromkeys(r["task"] for r in tables["link"].records):
        uri = link_scatter(tables["link"], task)
        if uri:
            out += img(uri, f"retention against concentration, {task}")
            out += (
                f"<p class='caption'>{html.escape(task)}: each point a model (circles: quick; triangles: "
                "mid), retention on translated inputs against each concentration measure; ρ: Spearman, "
                "with its bootstrap interval.</p>"
            )
    return out


# ------------------------------------------------------------------------------------------------
def render_html(summary: Summary, report_title: str | None = None) -> str:
    cells = summary.cells
    header = _header_html(summary)
    sections: list[tuple[str, str, str]] = [("accuracy", "Accuracy", _accuracy_html(summary))]
    sections.append(
        (
            "deposits",
            "Single-head deposits and layer concentration: head ablation",
            _deposits_html(summary),
        )
    )
    if "study" in summary.tables:
        t = summary.tables["study"]
        sections.append(("study", t.title, table_html(t)))
    if "link" in summary.tables:
        sections.append(
            (
                "generalization",
                "Length generalisation and concentration",
                generalization_section(summary),
            )
        )
    sections.append(("dynamics", "Deposit dynamics", _dynamics_html(cells)))
    sections.append(
        (
            "patching",
            "Patching, positional heads and logit terms",
            patching_section(cells) + positional_section(cells) + decomposition_section(cells),
        )
    )
    sections.append(("circuits", "Circuits: position and content edges", circuits_section(cells)))
    sections.append(("attention", "Attention patterns of the top heads", _attention_html(cells)))
    # The claims come after the figures: the first screen answers the main question instead.
    sections.append(
        ("claims", "Claims C1–C17", table_html(summary.tables["claims"], status_col="Status"))
    )

    nav = (
        "<nav>" + "".join(f"<a href='#{k}'>{html.escape(t)}</a>" for k, t, _ in sections) + "</nav>"
    )
    body = "".join(
        f"<section id='{k}'><h2>{html.escape(t)}</h2>{content}</section>"
        for k, t, content in sections
    )
    title = html.escape(report_title or f"pe-interp reproduction report: preset {summary.preset}")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{CSS}{VERDICT_CSS}</style></head>\n<body>"
        f"<h1>{title}</h1>{first_screen(cells)}{header}{nav}{body}"
        "<p class='note'>Generated by <code>pe_interp.report</code>. Self-contained: no network access needed.</p>"
        "</body></html>\n"
    )


def _header_html(summary: Summary) -> str:
    """The summary's header lines, the failed cells, the source note and the warnings."""
    header = (
        "<ul>"
        + "".join(
            f"<li>{inline_md(line.lstrip('- ').strip())}</li>"
            for line in summary.header_lines()
            if not line.startswith("  ")
        )
        + "</ul>"
    )
    if summary.failed:
        header += (
            "<ul>"
            + "".join(
                f"<li><code>{html.escape(f['id'])}</code>: {html.escape(f['error'])}</li>"
                for f in summary.failed
            )
            + "</ul>"
        )
    header += f"<p class='note'>{inline_md(SOURCE_NOTE)}</p>"
    header += "".join(f"<p class='warn'>{inline_md(n)}</p>" for n in summary.notes)
    return header


def _accuracy_html(summary: Summary) -> str:
    cells = summary.cells
    acc = acc_stats(cells)
    baselines = {
        r["task"]: {"chance": r["chance"] / 100, "length_only": r["length_only"] / 100}
        for r in summary.tables["baselines"].records
    }
    acc_html = img(accuracy_bars(cells, acc, baselines), "accuracy by encoding")
    acc_html += (
        "<p class='note'>Bars: mean held-out accuracy over seeds (error bar: std; dots: seeds), "
        "coloured by encoding kind. Diamonds: the paper's number where the summaries give one [S]. "
        "Dotted: chance; dashed: length-only ceiling.</p>"
    )
    return (
        acc_html + table_html(summary.tables["accuracy"]) + table_html(summary.tables["baselines"])
    )


def _deposits_html(summary: Summary) -> str:
    """The deposit table, each further task's heatmaps, and the rotary task-1 models' lines."""
    cells = summary.cells
    dep = table_html(summary.tables["deposits"])
    for task in task_order(cells):
        if task == first_task(cells):
            dep += f"<p class='note'>The {html.escape(task)} models' heatmaps are at the top of the page.</p>"
            continue
        dep += _task_heatmaps(cells, task)
    lines = ""
    for label in rotary_task1_labels(cells):
        models = _ablated(cells, label, "distance")
        if models:
            c = models[0]
            lines += img(
                model_layer_lines(
                    c, f"{label} · task 1 · seed {c.seed}: accuracy with one head ablated"
                ),
                f"per-layer ablation {label}",
            )
    if lines:
        dep += (
            "<h3>Per-layer head ablation of task-1 models with a rotary part (the paper's plots; lowest "
            "seed)</h3>" + lines
        )
    return dep


def _ablated(cells: list[CellInfo], label: str, task: str) -> list[CellInfo]:
    """The cells of one encoding and task with a head-ablation sweep, by seed."""
    return sorted(
        (c for c in cells if c.label == label and c.task == task and c.ablation is not None),
        key=lambda c: c.seed,
    )


def _task_heatmaps(cells: list[CellInfo], task: str) -> str:
    """One task's ablation heatmaps, an encoding each, on one colour scale."""
    vmax = common_vmax(cells, task)
    figs = []
    for label in label_order(cells):
        models = _ablated(cells, label, task)
        if not models:
            continue
        base = sum(c.ablation.baseline for c in models) / len(models)
        title = (
            f"{label} · {task} · "
            + (f"mean of {len(models)} seeds" if len(models) > 1 else f"seed {models[0].seed}")
            + f" · baseline {100 * base:.1f}%"
        )
        figs.append(model_heatmap(models, title, vmax=vmax))
    if not figs:
        return ""
    return (
        f"<h3>{html.escape(task)}: accuracy drop per ablated head (heads of a concentrated layer outlined; "
        f"one colour scale, ±{100 * vmax:.0f} points)</h3>"
        "<div class='figs'>" + "".join(img(f, "ablation heatmap") for f in figs) + "</div>"
    )


def _dynamics_html(cells: list[CellInfo]) -> str:
    dyn_html = ""
    for label in label_order(cells):
        for c in sorted(
            (c for c in cells if c.label == label and c.task == "distance"), key=lambda c: c.seed
        )[:1]:
            uri = model_dynamics(c, f"{label} · task 1 · seed {c.seed}: deposit dynamics, layer 0")
            if uri:
                dyn_html += img(uri, f"dynamics {label}")
    if not dyn_html:
        return "<p class='note'>No deposit dynamics recorded (deposit_dynamics.jsonl) in these runs.</p>"
    return (
        "<p class='note'>Single-head ablation drops of layer 0 measured during training on the "
        "first held-out examples (`probes.deposit.DepositDynamics`): each head's drop, and the margin between "
        "the first and second head (C16), lowest seed of each task-1 model.</p>" + dyn_html
    )


def _attention_html(cells: list[CellInfo]) -> str:
    widgets = InlineWidgets()
    att = attention_section(cells, widgets)
    return (
        "<p class='note'>Attention patterns (circuitsvis) on held-out examples: the chosen head first, "
        "then the other heads of its layer in order of ablation drop. Hover or click a head in the "
        "widget to compare.</p>" + widgets.bundle_html() + att
    )


__all__ = ["render_html", "table_html"]

"""``report.html`` of one run directory (``pe-interp report RUN_DIR``).

It shows what the run's probes wrote into the directory (``pe-interp ablate``, ``patch``,
``decompose``, or a sweep's per-cell probes): the first screen answers "is there a single-head
deposit, and where?" from ``ablation.json`` / ``deposits.json``; then the configuration,
accuracy, each layer's deposit statistics, patching, positional scores, the logit terms, and
the figures the commands drew. Like the rest of the report it computes nothing about the model.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from pe_interp.report.cvis import InlineWidgets
from pe_interp.report.data import load_run_cell
from pe_interp.report.html import CSS, patching_section, positional_section
from pe_interp.report.markup import inline_md
from pe_interp.report.summary import Table
from pe_interp.report.verdict import CSS as VERDICT_CSS
from pe_interp.report.verdict import decomposition_section, first_screen
from pe_interp.runs.checkpoint import STALE, weights_status
from pe_interp.util.io import atomic_write_text, read_json

MAX_FIGURE_BYTES = 2_000_000  # PNGs from RUN_DIR/figures larger than this are linked, not inlined


def _table(t: Table) -> str:
    from pe_interp.report.html import table_html

    return table_html(t)


def render_run_html(run_dir: str | Path, step: int | None = None) -> str:
    """A run's report page; ``step``: of the snapshot of that step (its results in ``steps/S/``)."""
    from pe_interp.runs.checkpoint import STEPS_DIR

    run_dir = Path(run_dir)
    results = run_dir if step is None else run_dir / STEPS_DIR / str(step)
    name = str(run_dir) if step is None else f"{run_dir}@{step}"
    cell = load_run_cell(run_dir, step)
    config = cell.config or {}
    m, tr, task = config.get("model", {}), config.get("train", {}), config.get("task", {})
    parts = []
    stale = dict(cell.extra.get("stale", {}))
    for f in sorted(results.glob("decompose_L*H*.json")):
        status, why = weights_status(run_dir, f, step)
        if status == STALE:
            stale[f.name] = why
    if stale:  # shown first: results of other weights are left out of this report, and say so
        parts.append(
            "<div class='verdict'><p class='answer'><b>Stale results left out.</b> These files were computed "
            "from other weights than this run's <code>model.safetensors</code>; rerun the command that wrote "
            "each (<code>pe-interp ablate</code>, <code>patch</code>, <code>decompose</code>):</p><ul>"
            + "".join(
                f"<li><code>{html.escape(k)}</code>: {html.escape(v)}</li>"
                for k, v in stale.items()
            )
            + "</ul></div>"
        )
    if cell.ablation is None:
        parts.append(
            "<div class='verdict'><p class='answer'><b>Not measured yet.</b> This run has no head-ablation "
            f"sweep: run <code>pe-interp ablate {html.escape(name)}</code>, then this command again."
            "</p></div>"
        )
    else:
        parts.append(first_screen([cell]))
    rows = [
        ["encoding", f"`{cell.label}` ({cell.kind})"],
        [
            "model",
            ", ".join(
                f"{k} {m.get(k)}"
                for k in (
                    "n_layers",
                    "d_model",
                    "n_heads",
                    "d_head",
                    "d_mlp",
                    "act_fn",
                    "normalization_type",
                    "final_norm",
                    "dropout",
                    "init_mode",
                    "mask_padding",
                    "kv_source",
                )
            ),
        ],
        ["task", ", ".join(f"{k} {v}" for k, v in task.items())],
        [
            "training",
            ", ".join(
                f"{k} {tr.get(k)}"
                for k in (
                    "n_train",
                    "n_test",
                    "epochs",
                    "batch_size",
                    "lr",
                    "betas",
                    "lr_schedule",
                    "seed",
                )
            ),
        ],
        [
            "preset",
            f"`{config.get('preset')}`"
            + (" with the authors' quirks" if config.get("authors_quirks") else ""),
        ],
    ]
    if config.get("command"):
        rows.append(["re-create with", f"`{config['command']}`"])
    parts.append("<h2>Run</h2>" + _table(Table("run", str(run_dir), ["", ""], rows)))
    metrics = [r for r in _metrics(run_dir)]
    if metrics:
        cols = ["step", "epoch", "train_loss", "train_acc", "test_loss", "test_acc"]
        body = [[_fmt(r.get(c)) for c in cols] for r in metrics]
        parts.append("<h2>Accuracy</h2>" + _table(Table("metrics", "metrics.jsonl", cols, body)))
    if cell.deposits is not None:
        cols = ["layer", "top head", "drop", "runner-up", "its drop", "share", "deposit", "why not"]
        body = [
            [
                str(s.layer),
                f"H{s.top_head}",
                _fmt(s.top_drop),
                f"H{s.second_head}",
                _fmt(s.second_drop),
                _fmt(s.share),
                "**yes**" if s.is_deposit else "no",
                "; ".join(s.failed),
            ]
            for s in cell.deposits.layers
        ]
        parts.append(
            "<h2>Deposits, layer by layer</h2>"
            + _table(Table("layers", "deposits.json", cols, body))
        )
    more = patching_section([cell]) if cell.patching is not None else ""
    more += positional_section([cell]) + decomposition_section([cell])
    for f in sorted(results.glob("decompose_L*H*.json")):
        if f.name in stale:
            continue
        d = read_json(f)
        shares = d.get("variance_shares", {})
        body = [[k, _fmt(v)] for k, v in shares.items()]
        more += _table(
            Table(
                f.stem,
                f"{f.name}: variance share of each logit term (L{d.get('layer')}H{d.get('head')})",
                ["term", "share"],
                body,
            )
        )
    if more:
        parts.append("<h2>Patching and logit terms</h2>" + more)
    figs = sorted((results / "figures").glob("*.png")) if (results / "figures").is_dir() else []
    if figs:
        shown = []
        for f in figs:
            if f.stat().st_size <= MAX_FIGURE_BYTES:
                uri = "data:image/png;base64," + base64.b64encode(f.read_bytes()).decode("ascii")
                shown.append(
                    f"<figure><img alt='{html.escape(f.name)}' src='{uri}'>"
                    f"<figcaption class='caption'>figures/{html.escape(f.name)}</figcaption></figure>"
                )
            else:
                shown.append(
                    f"<p class='note'>figures/{html.escape(f.name)} (too large to inline)</p>"
                )
        parts.append(
            "<h2>Figures drawn by the commands</h2><div class='figs'>" + "".join(shown) + "</div>"
        )
    if cell.attention is not None and cell.ablation is not None:
        from pe_interp.report.attention import attention_section

        widgets = InlineWidgets()
        att = attention_section([cell], widgets)
        parts.append("<h2>Attention patterns</h2>" + widgets.bundle_html() + att)
    files = sorted(
        p
        for p in results.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and p.relative_to(results).parts[0] not in ("snapshots", "steps")
    )
    parts.append(
        "<h2>Files</h2><ul class='note'>"
        + "".join(
            f"<li><code>{html.escape(str(p.relative_to(results)))}</code> ({p.stat().st_size:,} bytes)</li>"
            for p in files
        )
        + "</ul>"
    )
    title = html.escape(
        f"pe-interp run report: {run_dir.name}" + ("" if step is None else f" at step {step}")
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{CSS}{VERDICT_CSS}</style></head>\n<body><h1>{title}</h1>"
        + "".join(parts)
        + f"<p class='note'>{inline_md('Generated by `pe-interp report`. Self-contained: no network access needed.')}</p>"
        "</body></html>\n"
    )


def _metrics(run_dir: Path) -> list[dict]:
    from pe_interp.runs.checkpoint import read_jsonl

    return read_jsonl(run_dir / "metrics.jsonl")


def _fmt(x) -> str:
    if isinstance(x, float):
        return "—" if math.isnan(x) else f"{x:.4g}"
    return "—" if x is None else str(x)


def write_run_report(run_dir: str | Path, step: int | None = None) -> Path:
    """Write ``RUN_DIR/report.html`` (``step``: ``RUN_DIR/steps/S/report.html``); returns its path."""
    from pe_interp.runs.checkpoint import STEPS_DIR

    run_dir = Path(run_dir)
    out = run_dir if step is None else run_dir / STEPS_DIR / str(step)
    return atomic_write_text(out / "report.html", render_run_html(run_dir, step))


__all__ = ["render_run_html", "write_run_report"]

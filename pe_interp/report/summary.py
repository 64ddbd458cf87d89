"""The reproduction's tables: accuracy by encoding kind, deposits per model, claims C1–C17.

:func:`build_summary` reads a reproduce directory and returns a :class:`Summary`; its
:meth:`Summary.markdown` is ``summary.md`` and :meth:`Summary.to_dict` is ``summary.json`` (the
same tables: every Markdown row is ``table["rows"]``, with the numbers behind it in
``table["records"]``). The HTML report renders the same :class:`Table` objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pe_interp.io import read_json
from pe_interp.report.claims import (
    CEILING,
    DOMINANT,
    PAPER_SETTING,
    STATUSES,
    Claim,
    Context,
    evaluate_claims,
)
from pe_interp.report.data import (
    KIND_ORDER,
    TASK_TITLES,
    AccStat,
    CellInfo,
    acc_stats,
    ci_of,
    dominance,
    label_order,
    large_heads,
    layer_deposit,
    load_cells,
    task_baselines,
    task_order,
    top,
)
from pe_interp.report.labels import paper_acc

SOURCE_NOTE = (
    "Paper numbers come from secondary summaries of the paper (papernotes, opennovelty; digest §5, "
    "tag [S]) and are unverified; the paper's own tables were not available. Words in quotes are "
    "the summaries' qualitative statements."
)


@dataclass
class Table:
    """A table shown in summary.md, summary.json and report.html alike."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        def cell(x: Any) -> str:
            return str(x).replace("|", "\\|").replace("\n", " ")

        lines = [
            "| " + " | ".join(cell(c) for c in self.columns) + " |",
            "|" + "---|" * len(self.columns),
        ]
        lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in self.rows]
        if not self.rows:
            lines.append("| " + " | ".join(["(none)"] + [""] * (len(self.columns) - 1)) + " |")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "records": self.records,
            "notes": self.notes,
        }


def _num(x: float | None, scale: float = 100.0, digits: int = 1) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(scale * x, 6)


def _fmt_pct(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.1f}"


@dataclass
class Summary:
    out_dir: Path
    preset: str
    header: dict[str, Any]
    failed: list[dict[str, str]]
    tables: dict[str, Table]
    claims: list[Claim]
    cells: list[CellInfo]
    notes: list[str] = field(default_factory=list)
    gradients: dict[str, Any] | None = None

    # ---- summary.md ---------------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        h = self.header
        lines = [
            f"- **Preset**: `{self.preset}`"
            + (
                f" (runs were trained with preset `{h['run_preset']}`)"
                if h.get("run_preset") not in (None, self.preset)
                else ""
            )
        ]
        if h.get("model_text"):
            lines.append(f"- **Model**: {h['model_text']}")
        if h.get("train_text"):
            lines.append(f"- **Training**: {h['train_text']}")
        for t, text in h.get("task_text", {}).items():
            lines.append(f"- **{TASK_TITLES.get(t, t)}**: {text}")
        lines.append(
            f"- **Runs**: {h['n_runs']} finished ({h['n_settings']} encoding × task settings; "
            f"seeds {', '.join(map(str, h['seeds'])) or 'none'})"
        )
        if self.failed:
            lines.append(f"- **Failed cells ({len(self.failed)})**:")
            lines += [f"  - `{f['id']}`: {f['error']}" for f in self.failed]
        else:
            lines.append("- **Failed cells**: none")
        return lines

    def markdown(self) -> str:
        out = [f"# Reproduction summary: preset `{self.preset}`", ""]
        out += self.header_lines()
        out += ["", SOURCE_NOTE, ""]
        extra = [k for k in self.tables if k.startswith("generalization-")] + [
            "concentration",
            "link",
        ]
        for key in ("accuracy", "baselines", "deposits", "study", *extra, "claims"):
            if key not in self.tables:
                continue
            t = self.tables[key]
            out += [f"## {t.title}", "", t.markdown()]
            out += [f"{n}" for n in t.notes]
            out.append("")
        out += [f"{n}" for n in self.notes]
        return "\n".join(out).rstrip() + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "out_dir": str(self.out_dir),
            "header": self.header,
            "failed": self.failed,
            "source_note": SOURCE_NOTE,
            "tables": {k: t.to_dict() for k, t in self.tables.items()},
            "claims": [c.to_dict() for c in self.claims],
            "notes": self.notes,
            "gradients": self.gradients,
        }


# ------------------------------------------------------------------------------------------------
# header
# ------------------------------------------------------------------------------------------------
def _header(cells: list[CellInfo], out_dir: Path) -> dict[str, Any]:
    config = next((c.config for c in cells if c.config), None)
    h: dict[str, Any] = {
        "n_runs": len(cells),
        "n_settings": len({(c.label, c.task) for c in cells}),
        "seeds": sorted({c.seed for c in cells}),
        "encodings": list(dict.fromkeys(c.label for c in cells)),
        "tasks": list(dict.fromkeys(c.task for c in cells)),
    }
    grid = out_dir / "grid.json"
    if grid.is_file():
        h["grid"] = read_json(grid).get("name")
    if config:
        m, tr = config.get("model", {}), config.get("train", {})
        h["run_preset"] = config.get("preset")
        h["model"] = {
            k: m.get(k)
            for k in (
                "n_layers",
                "d_model",
                "n_heads",
                "d_head",
                "d_mlp",
                "dropout",
                "mask_padding",
                "kv_source",
                "attention_dir",
                "pooling",
            )
        }
        h["model_text"] = (
            f"{m.get('n_layers')} layers, d_model {m.get('d_model')}, {m.get('n_heads')} heads "
            f"(d_head {m.get('d_head')}), d_mlp {m.get('d_mlp')}, dropout {m.get('dropout')}; "
            f"attention {m.get('attention_dir')}, keys/values from `{m.get('kv_source')}`, "
            f"padding {'masked' if m.get('mask_padding') else 'NOT masked (authors’ quirk)'}"
        )
        h["train"] = {
            k: tr.get(k) for k in ("epochs", "n_train", "n_test", "batch_size", "lr", "betas")
        }
        h["train_text"] = (
            f"{tr.get('epochs')} epochs, {tr.get('n_train')} train / {tr.get('n_test')} "
            f"held-out examples, batch {tr.get('batch_size')}, lr {tr.get('lr')}, "
            f"betas {tr.get('betas')}"
        )
    task_text = {}
    for t in task_order(cells):
        cfg = next((c.config for c in cells if c.task == t and c.config), None)
        if cfg and "task" in cfg:
            task_text[t] = ", ".join(
                f"{k} {v}" for k, v in cfg["task"].items() if k not in ("name", "seed")
            )
    h["task_text"] = task_text
    return h


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------
def accuracy_table(cells: list[CellInfo], acc: dict[tuple[str, str], AccStat]) -> Table:
    tasks = task_order(cells)
    kind_of = {c.label: c.kind for c in cells}
    cols = ["Kind", "Encoding"]
    for t in tasks:
        cols += [
            f"{TASK_TITLES.get(t, t)}: acc % (mean ± std, n)",
            f"{TASK_TITLES.get(t, t)}: paper % [S]",
        ]
    rows, records = [], []
    for label in label_order(cells):
        row = [kind_of[label], label]
        rec: dict[str, Any] = {"kind": kind_of[label], "encoding": label}
        for t in tasks:
            s = acc.get((label, t))
            row.append(
                "not run" if s is None else f"{100 * s.mean:.1f} ± {100 * s.std:.1f} ({s.n})"
            )
            row.append(paper_acc(label, t))
            rec[t] = (
                None
                if s is None
                else {
                    "mean": _num(s.mean),
                    "std": _num(s.std),
                    "n": s.n,
                    "seeds": [_num(v) for v in s.values],
                }
            )
            rec[f"{t}_paper"] = paper_acc(label, t)
        rows.append(row)
        records.append(rec)
    kinds_present = [k for k in KIND_ORDER if k in kind_of.values()]
    notes = [
        f"Rows are grouped by encoding kind ({', '.join(kinds_present) or 'none run'}). The paper "
        "columns quote secondary summaries (unverified, see above).",
        "`rope` is pure RoPE; the authors' code's “rope” model is `sinusoidal+rope` (digest §9.1), "
        "and which of the two gave the paper's 92.64% is unknown. `decoupled_rope` is MLA-style "
        "decoupled RoPE only, not the authors' full MLA model (digest §9.4).",
    ]
    return Table("accuracy", "Accuracy by encoding and task", cols, rows, records, notes)


def baselines_table(baselines: dict[str, dict[str, float]]) -> Table:
    cols = ["Task", "Classes", "Chance % (best constant class)", "Length-only Bayes ceiling %"]
    rows, records = [], []
    for t, b in baselines.items():
        rows.append(
            [
                TASK_TITLES.get(t, t),
                str(b["n_classes"]),
                f"{100 * b['chance']:.2f}",
                f"{100 * b['length_only']:.2f}",
            ]
        )
        records.append(
            {
                "task": t,
                "n_classes": b["n_classes"],
                "chance": _num(b["chance"], digits=2),
                "length_only": _num(b["length_only"], digits=2),
            }
        )
    notes = [
        "Exact, computed analytically from each task's generator (`chance_accuracy()`, "
        "`length_only_accuracy()`). The length-only ceiling is what a model that sees only the "
        "number of real tokens can reach."
    ]
    return Table("baselines", "Task baselines", cols, rows, records, notes)


def deposit_table(cells: list[CellInfo]) -> Table:
    cols = [
        "Encoding",
        "Kind",
        "Task",
        "Seed",
        "Test acc %",
        "Ablation baseline %",
        "Single-head deposit?",
        "Layer concentration",
        "Layer",
        "Head",
        "Drop (pts)",
        "Share of layer drop",
        "CI (pts)",
    ]
    order = {lab: i for i, lab in enumerate(label_order(cells))}
    tasks = task_order(cells)
    rows, records = [], []
    for c in sorted(cells, key=lambda c: (tasks.index(c.task), order[c.label], c.seed)):
        a = c.ablation
        rec: dict[str, Any] = {
            "id": c.id,
            "encoding": c.label,
            "kind": c.kind,
            "task": c.task,
            "seed": c.seed,
            "test_acc": _num(c.test_acc),
            "layer_concentration": c.found,
            "concentrated_heads": [list(h) for h in c.flagged],
        }
        if a is None:
            rows.append(
                [
                    c.label,
                    c.kind,
                    c.task,
                    str(c.seed),
                    _fmt_pct(c.test_acc),
                    "—",
                    "not measured",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                ]
            )
            rec["measured"] = False
            records.append(rec)
            continue
        d = dominance(a)
        layer, head = d.layer, d.head
        st = layer_deposit(a, layer)
        drop = float(a.drops[layer, head])
        pos = [max(0.0, x) for x in a.drops[layer] if not math.isnan(x)]
        share = drop / sum(pos) if sum(pos) > 0 and drop > 0 else 0.0
        ci = ci_of(a, layer, head)
        if c.found:
            concentrated = ", ".join(f"L{x}H{y}" for x, y in c.flagged)
        else:
            concentrated = {False: "none", None: "n/a (no report)"}[c.found]
        level = a.ci
        rows.append(
            [
                c.label,
                c.kind,
                c.task,
                str(c.seed),
                _fmt_pct(c.test_acc),
                _fmt_pct(a.baseline),
                "yes" if d.single else "no",
                concentrated,
                str(layer),
                str(head),
                f"{100 * drop:.1f}",
                f"{100 * share:.0f}%",
                "—"
                if ci is None
                else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}] ({100 * level:.0f}%)",
            ]
        )
        rec.update(
            {
                "measured": True,
                "baseline": _num(a.baseline),
                "layer": layer,
                "head": head,
                "drop": _num(drop),
                "share": round(share, 4),
                "ci": None if ci is None else [_num(ci[0]), _num(ci[1])],
                "ci_level": level,
                "layer_top_head": st.top_head,
                "method": a.method,
                "metric": a.metric,
                "n_examples": a.n_examples,
                "max_drop": _num(top(a)[2]),
                "heads_ge_50": len(large_heads(a)),
                "runner_up": _num(d.runner_up),
                "others_max_abs": _num(d.others_max_abs),
                "single_head_deposit": d.single,
            }
        )
        records.append(rec)
    report = next((c.deposits for c in cells if c.deposits is not None), None)
    rule = ""
    if report is not None:
        rule = (
            " **Layer concentration** (`probes.deposit.find_deposits`, a looser, per-layer flag, not a "
            f"deposit): a layer's top head costs ≥ {100 * report.min_drop:.0f} points and ≥ "
            f"{100 * report.min_share:.0f}% of the layer's drop"
            + (", and its CI lies above the runner-up's drop" if report.require_separation else "")
            + "."
        )
    notes = [
        "Single-head ablation on held-out examples (`probes.ablation`, zero ablation of the head's "
        f"output, = the authors' value-zeroing). **Single-head deposit?**: {DOMINANT}. The row shows the "
        "head with the largest drop in the whole model."
        + rule
        + " **Drop** is accuracy points lost; "
        "**share** is the head's drop over the sum of the positive drops of all heads in its layer; "
        "**CI** is the paired bootstrap interval of the drop.",
    ]
    return Table(
        "deposits",
        "Single-head deposits and layer concentration, per model",
        cols,
        rows,
        records,
        notes,
    )


def claims_table(claims: list[Claim]) -> Table:
    cols = ["#", "Claim", "Source", "Status", "Criterion (fixed in advance)", "Evidence (this run)"]
    rows = [[c.id, c.text, c.source, f"**{c.status}**", c.criterion, c.evidence] for c in claims]
    notes = [
        "Statuses: **reproduced**, **not reproduced**, **not measured** (not run, or no room to "
        "test it), **sanity check** (holds by construction: it checks this code, not the paper). "
        "Criteria are fixed in `pe_interp/report/claims.py` from the claim text and the digest's "
        "tolerances (§10), never from this run's numbers. Accuracy claims use seed means, and an "
        f"ordering is not measured when every encoding compared is at the ceiling (≥ {100 * CEILING:.0f}%). "
        f"A deposit is {DOMINANT}; a model whose baseline is < 50% cannot show one and is not "
        "judged. A single-model ablation claim holds when it holds in a strict majority of "
        "seeds; a “no deposit” claim must hold in every seed."
    ]
    return Table(
        "claims",
        "Claims C1–C17 (paper digest §10)",
        cols,
        rows,
        [c.to_dict() for c in claims],
        notes,
    )


# ------------------------------------------------------------------------------------------------
def build_summary(
    out_dir: str | Path,
    preset: str = "quick",
    gradients: dict[str, Any] | None = None,
    cells: list[CellInfo] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> Summary:
    out_dir = Path(out_dir)
    if cells is None:
        cells, errors = load_cells(out_dir)
    errors = errors or []
    acc = acc_stats(cells)
    baselines = task_baselines(cells)
    ctx = Context(cells=cells, acc=acc, baselines=baselines, preset=preset, gradients=gradients)
    claims = evaluate_claims(ctx)
    assert all(c.status in STATUSES for c in claims)
    failed = [
        {
            "id": str(e.get("id")),
            "error": str(e.get("error", "")).splitlines()[0] if e.get("error") else "?",
        }
        for e in errors
    ]
    tables = {
        "accuracy": accuracy_table(cells, acc),
        "baselines": baselines_table(baselines),
        "deposits": deposit_table(cells),
        "claims": claims_table(claims),
    }
    notes = []
    n_not = sum(c.status == "not reproduced" for c in claims)
    if preset != "paper" and n_not:
        notes.append(
            f"**{n_not} claim(s) did not reproduce at preset `{preset}`.** This preset is far "
            f"smaller than the paper's; {PAPER_SETTING}. A finding that fails here may still "
            "hold at that size, and one that holds here is not thereby confirmed at it."
        )
    if not cells:
        notes.append("No finished cells: nothing was measured.")
    return Summary(
        out_dir, preset, _header(cells, out_dir), failed, tables, claims, cells, notes, gradients
    )

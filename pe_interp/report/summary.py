"""The reproduction's tables: accuracy by encoding kind, deposits per model, claims C1–C17.

:func:`build_summary` reads a reproduce directory and returns a :class:`Summary`; its
:meth:`Summary.markdown` is ``summary.md`` and :meth:`Summary.to_dict` is ``summary.json`` (the
same tables: every Markdown row is ``table["rows"]``, with the numbers behind it in
``table["records"]``). The HTML report renders the same :class:`Table` objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pe_interp.report.claims import PAPER_SETTING, STATUSES, Claim, Context, evaluate_claims
from pe_interp.report.data import (
    TASK_TITLES,
    CellInfo,
    acc_stats,
    load_cells,
    task_baselines,
    task_order,
)
from pe_interp.report.summary_tables import (
    accuracy_table,
    baselines_table,
    claims_table,
    deposit_table,
)
from pe_interp.report.table import Table
from pe_interp.util.io import read_json

SOURCE_NOTE = (
    "Paper numbers come from secondary summaries of the paper (papernotes, opennovelty; digest §5, "
    "tag [S]) and are unverified; the paper's own tables were not available. Words in quotes are "
    "the summaries' qualitative statements."
)


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

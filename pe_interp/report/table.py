"""One table of the report: its columns, its Markdown rows, the numbers behind them, and notes.

:class:`Table` is what ``summary.md``, ``summary.json`` and the HTML report all render, whichever
module built it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Table"]


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

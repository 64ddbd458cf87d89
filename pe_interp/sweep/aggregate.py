"""Reading a sweep directory back: every cell's result, and one row per setting (see
:mod:`pe_interp.sweep`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pe_interp.runs.checkpoint import CURRENT, STALE, WEIGHTS, weights_status
from pe_interp.sweep.grid import ERROR, RESULT
from pe_interp.util.io import read_json
from probes import DepositReport

__all__ = ["aggregate", "collect", "deposits_of", "format_table"]


def collect(sweep_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(results, errors) of every cell in a sweep directory, in the order of the cell ids. A
    result whose probes came from other weights than its run's (:func:`weights_status`) is not
    a result: it is an error record that says so, until the sweep runs again and recomputes it."""
    cells_dir = Path(sweep_dir) / "cells"
    results, errors = [], []
    for d in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        if (d / RESULT).is_file():
            result = read_json(d / RESULT)
            status, why = (
                weights_status(d / "run", result)
                if (d / "run" / WEIGHTS).is_file()
                else (CURRENT, "")
            )
            if status == STALE:
                errors.append(
                    {
                        "id": result.get("id", d.name),
                        "error": f"stale results: {why}; rerun the sweep to recompute them",
                        "stale": True,
                    }
                )
            else:
                results.append(result)
        elif (d / ERROR).is_file():
            errors.append(read_json(d / ERROR))
    return results, errors


def deposits_of(result: dict[str, Any]) -> DepositReport | None:
    """The cell's deposit report (None when it had no ablation probe)."""
    dep = (result.get("ablation") or {}).get("deposits")
    return None if dep is None else DepositReport.from_dict(dep)


def _frozen(value: Any) -> Any:
    """A setting as a dict key: lists (``silent_heads: [[0, 1], ...]``) as tuples, dicts as sorted items."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def aggregate(results: list[dict[str, Any]], axes: list[str]) -> list[dict[str, Any]]:
    """One row per setting of ``axes``: accuracy mean ± std over seeds, how many seeds have a
    layer concentration, and layer 0's top-head drop, runner-up drop and share, each a mean over
    the ``l0_seeds`` seeds with an ablation report (every one of them)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        key = tuple((a, _frozen(r["params"].get(a, "(base)"))) for a in axes)
        groups.setdefault(key, []).append(r)
    rows = []
    for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        accs = [m["final"]["test_acc"] for m in members]
        row: dict[str, Any] = dict(key)
        row["n_seeds"] = len(members)
        row["acc_mean"] = statistics.fmean(accs)
        row["acc_std"] = statistics.stdev(accs) if len(accs) > 1 else 0.0
        reports = [r for m in members if (r := deposits_of(m)) is not None]
        if reports:
            # the looser per-layer flag of probes.deposit (not a single-head deposit)
            row["concentrated_seeds"] = sum(bool(r.deposits) for r in reports)
            # layer 0 of every seed with an ablation report: the means are over all of them
            l0 = [s for r in reports for s in r.layers if s.layer == 0]
            row["l0_seeds"] = len(l0)
            if l0:
                row["l0_top_drop"] = statistics.fmean(s.top_drop for s in l0)
                row["l0_second_drop"] = statistics.fmean(s.second_drop for s in l0)
                row["l0_top_share"] = statistics.fmean(s.share for s in l0)
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`aggregate` rows."""
    if not rows:
        return "(no finished cells)\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(row, c):
        if c == "acc_mean":
            return f"{100 * row['acc_mean']:.1f} ± {100 * row['acc_std']:.1f}"
        v = row.get(c, "")
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    cols = [c for c in cols if c != "acc_std"]
    head = "| " + " | ".join("acc % (mean ± std)" if c == "acc_mean" else c for c in cols) + " |"
    sep = "|" + "---|" * len(cols)
    body = ["| " + " | ".join(fmt(r, c) for c in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"

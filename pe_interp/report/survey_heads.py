"""The heads a survey's probes single out, side by side: one row per head that is among the
largest of any probe (ablation drop, patching restoration, route share), with what every other
probe measured of it and its head types. Read from the findings only."""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_interp.report.survey_circuit import circuit_column

__all__ = ["heads_across"]

TOP = 5  # heads taken from each probe's top


def _grid(step: dict[str, Any] | None, key: str) -> np.ndarray | None:
    if step is None:
        return None
    return np.array(step["result"][key], dtype=float)


def heads_across(steps: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines of the table (empty where fewer than two of the three probes ran)."""
    grids = {
        "ablation drop (points)": (_grid(steps.get("ablation"), "drops"), 100.0),
        "patching (restored)": (_grid(steps.get("patching"), "values"), 1.0),
        "route share (%)": (_grid(steps.get("routes"), "shares"), 100.0),
    }
    grids = {k: v for k, v in grids.items() if v[0] is not None}
    if len(grids) < 2:
        return []
    heads: list[tuple[int, int]] = []
    for grid, _ in grids.values():
        for flat in np.argsort(-np.nan_to_num(grid, nan=-np.inf), axis=None)[:TOP]:
            lh = tuple(int(i) for i in np.unravel_index(flat, grid.shape))
            if lh not in heads:
                heads.append(lh)  # type: ignore[arg-type]
    types = (steps.get("head_types") or {}).get("result", {}).get("types", {})
    kinds = {
        lh: ", ".join(k.replace("_", "-") for k, hs in types.items() if list(lh) in hs) or "none"
        for lh in heads
    }
    names = list(grids)
    circuit = steps.get("circuit")
    extra = [] if circuit is None else ["circuit: first unit out (rank; units out, in)"]
    lines = [
        f"Every head among the {TOP} largest of any probe, with what the other probes measured "
        "of it (ranks among all heads in brackets) and its head types:",
        "",
        "| head | " + " | ".join(names + extra) + " | types |",
        "|---|" + "---|" * len(names + extra) + "---|",
    ]
    for lh in sorted(heads):
        cells = []
        for grid, scale in grids.values():
            order = np.argsort(-np.nan_to_num(grid, nan=-np.inf), axis=None)
            rank = int(np.nonzero(order == np.ravel_multi_index(lh, grid.shape))[0][0]) + 1
            cells.append(
                f"{scale * grid[lh]:+.1f} [{rank}]" if scale != 1.0 else f"{grid[lh]:+.2f} [{rank}]"
            )
        if circuit is not None:
            cells.append(circuit_column(circuit, f"L{lh[0]}H{lh[1]}") or "")
        lines.append(f"| L{lh[0]}H{lh[1]} | " + " | ".join(cells) + f" | {kinds[lh]} |")
    return lines

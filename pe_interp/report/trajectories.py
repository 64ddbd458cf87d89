"""The deposit over training, from committed findings that kept every snapshot's criteria
(``findings/deposit-dynamics/*.json``, written by a sweep with ``snapshots: log`` and the
``snapshot_dynamics`` probe, :mod:`probes.deposit.trajectory`). It only reads.

Per condition: in how many seeds each criterion holds at some snapshot (k of n, Wilson 95%), with
each criterion's one definition (:mod:`probes.deposit.dominance`, :mod:`probes.deposit.detection`,
:mod:`probes.routes.shares`, decided on intervals by :mod:`probes.deposit.decision`); its onset
(first step it holds), last step and lifetime (the steps from its onset to the next snapshot
after the last one it holds at); the layer-0 lead's peak; and, where the lead fades, where the
work goes: the change from that peak to the last step in the summed drops of layer 0's other
heads and of the later layers.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.report.figures import new_figure, save_png
from probes.common.metrics import wilson

CRITERIA = (
    ("single_head", "single-head deposit"),
    ("layer0", "layer-0 concentration"),
    ("positional", "positional deposit"),
)

__all__ = [
    "CRITERIA",
    "has_snapshots",
    "seed_row",
    "trajectory_figure",
    "trajectory_markdown",
    "trajectory_rows",
]


def has_snapshots(findings: list[dict[str, Any]]) -> bool:
    return any(f.get("snapshots") for f in findings)


def seed_row(f: dict[str, Any]) -> dict[str, Any]:
    """One run's criteria over its snapshots (``holds``, ``onset``, ``last``, ``lifetime``, ``at``
    for each) and its layer-0 lead (``l0_peak``: the peak head, its drop and step, that head's
    drop at the end (``final``), layer 0's top drop and head at the end (``lead_final``,
    ``lead_final_head``), and where the work went after the peak) and ``l0_lead``, layer 0's top
    drop at every step (NaN read as 0)."""
    recs = sorted(f["snapshots"], key=lambda r: r["step"])
    steps = [r["step"] for r in recs]
    drops = [np.nan_to_num(np.asarray(r["drops"], dtype=float), nan=0.0) for r in recs]
    row: dict[str, Any] = {
        "condition": f["condition"],
        "seed": f["seed"],
        "test_acc": f.get("test_acc"),
        "steps": steps,
    }
    for key, _ in CRITERIA:
        verdicts = [r["verdicts"].get(key, {}).get("verdict") for r in recs]
        held = [i for i, v in enumerate(verdicts) if v == "yes"]
        row[key] = {
            "holds": bool(held),
            "undecided": sum(v == "undecided" for v in verdicts),
            "onset": steps[held[0]] if held else None,
            "last": steps[held[-1]] if held else None,
            "lifetime": (steps[min(held[-1] + 1, len(steps) - 1)] - steps[held[0]])
            if held
            else None,
            "at": [steps[i] for i in held],
        }
    l0 = [d[0] for d in drops]
    peak = int(np.argmax([x.max() for x in l0]))
    head = int(np.argmax(l0[peak]))
    end = len(recs) - 1

    def others(i: int) -> float:
        return float(np.clip(np.delete(l0[i], head), 0, None).sum())

    def later(i: int) -> float:
        return float(np.clip(drops[i][1:], 0, None).sum())

    row["l0_peak"] = {
        "step": steps[peak],
        "head": f"L0H{head}",
        "drop": float(l0[peak][head]),
        "final": float(l0[end][head]),
        "lead_final": float(l0[end].max()),
        "lead_final_head": f"L0H{int(np.argmax(l0[end]))}",
        "to_l0_others": others(end) - others(peak),
        "to_later_layers": later(end) - later(peak),
    }
    row["l0_lead"] = [float(x.max()) for x in l0]
    return row


def trajectory_rows(
    findings: list[dict[str, Any]], order: list[str] | None = None
) -> list[dict[str, Any]]:
    """One row per condition: its seeds' rows (``seeds``) and the counts over them."""
    seeds = [seed_row(f) for f in findings if f.get("snapshots")]
    names = list(dict.fromkeys([*(order or []), *(s["condition"] for s in seeds)]))
    rows = []
    for name in names:
        group = [s for s in seeds if s["condition"] == name]
        if not group:
            continue
        row: dict[str, Any] = {"condition": name, "n": len(group), "seeds": group}
        for key, _ in CRITERIA:
            k = sum(s[key]["holds"] for s in group)
            row[key] = {"k": k, "ci": wilson(k, len(group))}
        rows.append(row)
    return rows


def _med(xs: list[float | None], fmt: str = "{:.0f}") -> str:
    xs = [x for x in xs if x is not None]
    return "—" if not xs else fmt.format(statistics.median(xs))


def trajectory_markdown(rows: list[dict[str, Any]], source: str) -> str:
    """The dynamics study's table in findings/README.md, and its notes."""
    head = ["condition", "seeds", "final held-out acc %"]
    head += [f"{label} at some step, k of n [95% CI]" for _, label in CRITERIA]
    head += [
        "layer-0 concentration: onset / last / lifetime (steps, median)",
        "layer-0 lead: peak (pts) at step → final",
        "after the peak: Δ layer-0 others / Δ later layers (pts, median)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        g = r["seeds"]
        accs = [100 * s["test_acc"] for s in g if s["test_acc"] is not None]
        cells = [r["condition"], str(r["n"]), f"{statistics.mean(accs):.1f}" if accs else "—"]
        for key, _ in CRITERIA:
            k, (lo, hi) = r[key]["k"], r[key]["ci"]
            cells.append(f"{k} of {r['n']} [{100 * lo:.0f}, {100 * hi:.0f}]%")
        c = [s["layer0"] for s in g]
        cells.append(
            f"{_med([x['onset'] for x in c])} / {_med([x['last'] for x in c])} / "
            f"{_med([x['lifetime'] for x in c])}"
        )
        p = [s["l0_peak"] for s in g]
        cells.append(
            f"{_med([100 * x['drop'] for x in p], '{:.1f}')} at {_med([x['step'] for x in p])} → "
            f"{_med([100 * x['final'] for x in p], '{:.1f}')}"
        )
        cells.append(
            f"{_med([100 * x['to_l0_others'] for x in p], '{:+.1f}')} / "
            f"{_med([100 * x['to_later_layers'] for x in p], '{:+.1f}')}"
        )
        lines.append("| " + " | ".join(cells) + " |")
    total = sum(r["n"] for r in rows)
    sums = {key: sum(r[key]["k"] for r in rows) for key, _ in CRITERIA}
    notes = "; ".join(
        f"{label} at some snapshot in {sums[key]} of {total} runs "
        f"(Wilson 95% {100 * wilson(sums[key], total)[0]:.0f}–{100 * wilson(sums[key], total)[1]:.0f}%)"
        for key, label in CRITERIA
    )
    undecided = sum(s[key]["undecided"] for r in rows for s in r["seeds"] for key, _ in CRITERIA)
    lines += [
        "",
        f"Over all conditions: {notes}. Verdicts are decided on bootstrap intervals at every snapshot "
        f"({undecided} snapshot verdicts stayed undecided after confirmation). From `{source}` ({total} runs; "
        f"`pe-interp study {source} --readme findings/README.md` regenerates this table and "
        f"`{source}/study/dynamics.png`).",
    ]
    return "\n".join(lines)


def trajectory_figure(
    rows: list[dict[str, Any]], findings: list[dict[str, Any]], path: str | Path
) -> Path | None:
    """Per condition, every seed's top head (solid) and layer-0 top head (dotted) over training,
    with a marker at each snapshot where a criterion holds."""
    if not rows:
        return None
    fig = new_figure(max(9.0, 5.5 * len(rows)), 4.0)
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    marks = {"single_head": ("v", "C3"), "layer0": ("o", "C0"), "positional": ("s", "C2")}
    for ax, row in zip(axes, rows):
        for j, f in enumerate(
            x for x in findings if x["condition"] == row["condition"] and x.get("snapshots")
        ):
            recs = sorted(f["snapshots"], key=lambda r: r["step"])
            steps = [r["step"] for r in recs]
            d = [np.nan_to_num(np.asarray(r["drops"], dtype=float), nan=0.0) for r in recs]
            color = f"C{j % 10}"
            ax.plot(steps, [100 * x.max() for x in d], color=color, lw=1.2)
            ax.plot(steps, [100 * x[0].max() for x in d], color=color, lw=0.8, ls=":")
            for key, (marker, c) in marks.items():
                held = [
                    (s, 100 * x.max())
                    for s, x, r in zip(steps, d, recs)
                    if r["verdicts"].get(key, {}).get("verdict") == "yes"
                ]
                if held:
                    ax.scatter(*zip(*held), marker=marker, s=14, color=c, zorder=3)
        ax.axhline(50, color="grey", lw=0.6, ls="--")
        ax.set_title(row["condition"][:60], fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("drop when zero-ablated (pts)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(
        "Top head (solid) and layer-0 top head (dotted) per seed, zero-ablated on held-out examples\n"
        "markers where a criterion holds: single-head deposit (▼), layer-0 concentration (●), "
        "positional deposit (■)",
        fontsize=8,
    )
    return save_png(fig, path)

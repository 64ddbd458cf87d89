"""Two dynamics studies over the same seeds, compared seed by seed (``pe-interp study TEST
--paired REFERENCE``): the fade test (``findings/deposit-dynamics-fade``, weight decay off) against
the runs it repeats (``findings/deposit-dynamics``' ``base``). A seed fixes the data, the
initialisation and the order of training, so a pair differs only in what the two grids set
differently (named in the table's labels), and each seed is its own control.

Per seed: the steps at which layer-0 concentration holds, the layer-0 lead's peak (head, step)
and layer 0's top drop at the end (and its head, which may be another), in both runs
(:func:`pe_interp.report.trajectories.seed_row`, the one reading of a finding's snapshots). Over
the seeds: each criterion's k of n on either side and the exact sign test on the discordant pairs
(:func:`probes.common.metrics.sign_test`); the lead's paired differences. It only reads.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.report.figures import new_figure, save_png
from pe_interp.report.trajectories import CRITERIA, seed_row
from probes.common.metrics import sign_test

__all__ = ["paired_figure", "paired_labels", "paired_markdown", "paired_rows", "unpaired"]


def _runs(findings: list[dict[str, Any]], condition: str, where: str) -> dict[int, dict[str, Any]]:
    found = [f for f in findings if f.get("snapshots") and f["condition"] == condition]
    runs = {f["seed"]: f for f in found}
    if len(runs) < len(found):
        twice = sorted({f["seed"] for f in found if sum(g["seed"] == f["seed"] for g in found) > 1})
        raise ValueError(
            f"{where}: seed(s) {twice} of condition {condition!r} found more than once"
        )
    if not runs:
        names = sorted({f["condition"] for f in findings if f.get("snapshots")})
        raise ValueError(
            f"{where}: no run of condition {condition!r} with snapshots (conditions: {', '.join(names) or 'none'})"
        )
    return runs


def paired_rows(
    test: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    condition: str = "base",
    ref_condition: str = "base",
) -> list[dict[str, Any]]:
    """One row per seed run in both: ``seed``, ``test`` and ``reference`` (each a seed row), and the
    findings themselves (``test_finding``, ``reference_finding``), by seed. The two runs of a seed
    must have been probed at the same steps (else "at some snapshot" and "at the end" would not
    compare)."""
    t, r = _runs(test, condition, "test"), _runs(reference, ref_condition, "reference")
    both = sorted(set(t) & set(r))
    if not both:
        raise ValueError(f"no seed was run in both (test: {sorted(t)}, reference: {sorted(r)})")
    rows = [
        {
            "seed": s,
            "test": seed_row(t[s]),
            "reference": seed_row(r[s]),
            "test_finding": t[s],
            "reference_finding": r[s],
        }
        for s in both
    ]
    for row in rows:
        if row["test"]["steps"] != row["reference"]["steps"]:
            raise ValueError(
                f"seed {row['seed']}: the two runs were probed at different steps "
                f"(up to {row['test']['steps'][-1]} and {row['reference']['steps'][-1]}), so they do not pair"
            )
    return rows


def unpaired(
    test: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    condition: str = "base",
    ref_condition: str = "base",
) -> tuple[list[int], list[int]]:
    """The seeds run on one side only (test's, reference's): left out of the comparison."""
    t, r = _runs(test, condition, "test"), _runs(reference, ref_condition, "reference")
    return sorted(set(t) - set(r)), sorted(set(r) - set(t))


def paired_labels(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """What the two sides set differently (``weight_decay=0.0`` against ``weight_decay (default)``),
    from the first pair's parameters; every pair must differ the same way."""
    diffs = set()
    for row in rows:
        a, b = row["test_finding"].get("params", {}), row["reference_finding"].get("params", {})
        keys = sorted(k for k in set(a) | set(b) if a.get(k, "default") != b.get(k, "default"))
        diffs.add(
            tuple(
                (k, json.dumps(a.get(k, "default")), json.dumps(b.get(k, "default"))) for k in keys
            )
        )
    if len(diffs) != 1:
        raise ValueError(
            f"the pairs differ in different ways ({sorted(diffs)}), so they are not one comparison"
        )
    (diff,) = diffs

    def label(side: int) -> str:
        parts = []
        for key, *values in diff:
            v = json.loads(values[side])
            parts.append(f"{key} (default)" if v == "default" else f"{key}={v}")
        return ", ".join(parts) or "the same parameters"

    return label(0), label(1)


def _held(x: dict[str, Any], n_snapshots: int) -> str:
    at = x["at"]
    return "never" if not at else f"{at[0]}–{at[-1]} ({len(at)} of {n_snapshots} snapshots)"


def _lead(row: dict[str, Any]) -> str:
    p = row["l0_peak"]
    return (
        f"{100 * p['drop']:.1f} ({p['head']}, step {p['step']}) → {100 * p['lead_final']:.1f} "
        f"({p['lead_final_head']})"
    )


def paired_markdown(
    rows: list[dict[str, Any]],
    test_source: str,
    reference_source: str,
    left_out: tuple[list[int], list[int]] = ([], []),
) -> str:
    """The findings/README.md per-seed table and what the seeds say together (``left_out``: the
    seeds run on one side only, test's and reference's, from :func:`unpaired`)."""
    test_label, ref_label = paired_labels(rows)
    head = [
        "seed",
        f"{ref_label}: layer-0 concentration at",
        "layer-0 lead: peak (pts) → at the end",
        f"{test_label}: layer-0 concentration at",
        "layer-0 lead: peak (pts) → at the end",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        r, t = row["reference"], row["test"]
        lines.append(
            f"| {row['seed']} | {_held(r['layer0'], len(r['steps']))} | {_lead(r)} | "
            f"{_held(t['layer0'], len(t['steps']))} | {_lead(t)} |"
        )
    n = len(rows)
    notes = []
    for key, label in CRITERIA:
        only_ref = sum(
            row["reference"][key]["holds"] and not row["test"][key]["holds"] for row in rows
        )
        only_test = sum(
            row["test"][key]["holds"] and not row["reference"][key]["holds"] for row in rows
        )
        k_ref = sum(row["reference"][key]["holds"] for row in rows)
        k_test = sum(row["test"][key]["holds"] for row in rows)
        notes.append(
            f"{label} at some snapshot in {k_ref} of {n} seeds with {ref_label} and {k_test} of {n} with "
            f"{test_label} ({only_ref} only with the first, {only_test} only with the second; exact sign "
            f"test p = {sign_test(only_ref, only_test):.2g})"
        )

    def diffs(key: str) -> list[float]:
        return [
            100 * (row["test"]["l0_peak"][key] - row["reference"]["l0_peak"][key]) for row in rows
        ]

    peak, end = diffs("drop"), diffs("lead_final")
    lower = sum(d < 0 for d in end)

    def fall(side: str) -> list[float]:  # how far the lead fell from its peak to the end
        return [
            100 * (row[side]["l0_peak"]["drop"] - row[side]["l0_peak"]["lead_final"])
            for row in rows
        ]

    fell = [t - r for t, r in zip(fall("test"), fall("reference"))]
    only = "; ".join(
        f"seed(s) {', '.join(map(str, seeds))} run only with {label}"
        for seeds, label in zip(left_out, (test_label, ref_label))
        if seeds
    )
    lines += [
        "",
        f"Paired by seed ({n} seeds; the same data, initialisation and order on both sides"
        + (f"; left out: {only}" if only else "")
        + "): "
        + "; ".join(notes)
        + f". The layer-0 lead, {test_label} minus {ref_label}: at its peak "
        f"{_spread(peak)} points, at the end {_spread(end)} (lower in {lower} of {n} seeds). From its peak "
        f"to the end the lead fell by a median of {statistics.median(fall('reference')):.1f} points with "
        f"{ref_label} and {statistics.median(fall('test')):.1f} with {test_label} (paired difference "
        f"{_spread(fell)}; further with {test_label} in {sum(d > 0 for d in fell)} of {n} seeds). From "
        f"`{test_source}` against `{reference_source}` (`pe-interp study {test_source} --paired "
        f"{reference_source} --readme findings/README.md` regenerates this table and `{test_source}/study/paired.png`).",
    ]
    return "\n".join(lines)


def _spread(xs: list[float]) -> str:
    def pts(x: float) -> str:
        return f"{round(x, 9) + 0.0:+.1f}"  # no "-0.0" from float noise

    return f"median {pts(statistics.median(xs))} (from {pts(min(xs))} to {pts(max(xs))})"


def paired_figure(rows: list[dict[str, Any]], path: str | Path) -> Path | None:
    """One panel per seed: layer 0's top drop over training on both sides, with a marker where
    layer-0 concentration holds."""
    if not rows:
        return None
    test_label, ref_label = paired_labels(rows)
    cols = min(3, len(rows))
    n_rows = -(-len(rows) // cols)
    fig = new_figure(4.0 * cols, 2.8 * n_rows)
    axes = np.atleast_1d(fig.subplots(n_rows, cols, squeeze=False)).ravel()
    for ax, row in zip(axes, rows):
        for side, label, color in (("reference", ref_label, "C0"), ("test", test_label, "C3")):
            steps, lead = row[side]["steps"], [100 * x for x in row[side]["l0_lead"]]
            ax.plot(steps, lead, color=color, lw=1.2, label=label)
            at = set(row[side]["layer0"]["at"])
            held = [(s, y) for s, y in zip(steps, lead) if s in at]
            if held:
                ax.scatter(*zip(*held), marker="o", s=14, color=color, zorder=3)
        ax.axhline(20, color="grey", lw=0.6, ls="--")
        ax.set_title(f"seed {row['seed']}", fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.set_ylabel("layer 0's top drop (pts)", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in axes[len(rows) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Layer 0's top head zero-ablated on held-out examples, paired by seed; "
        "● where layer-0 concentration holds (dashed: its 20-point bar)",
        fontsize=8,
    )
    return save_png(fig, path)

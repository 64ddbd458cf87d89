"""``pe-interp reproduce``: the paper's runs and probes, then its tables and an offline report.

Runs go through the sweep runner (:mod:`pe_interp.sweep`), so a rerun skips finished work and a
failed run is reported rather than stopping the rest. Every model gets held-out accuracy, the
full head-ablation sweep with deposit detection, and deposit dynamics recorded during training;
task-1 models with a rotary part (multiplicative or hybrid) also get head patching with distance
counterfactuals and per-head positional scores; the heads the report shows get their attention
patterns stored; and the sweep measures the gradient "seeds" at initialisation (C15). The report
then only reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_interp.report import write_report
from pe_interp.report.labels import ENCODINGS, encoding_label
from pe_interp.sweep import Grid, SweepSummary, parse_grid, run_sweep

SMOKE_ENCODINGS = ["nope", "sinusoidal", "rope"]
DEFAULT_SEEDS = {"smoke": 1, "quick": 3, "paper": 3}
PROBES = ("dynamics", "ablation", "patching", "positional", "attention", "gradients")


def reproduce_grid(
    preset: str = "quick",
    seeds: int | None = None,
    encodings: list[str] | None = None,
    tasks: tuple[str, ...] = ("distance", "count"),
    overrides: dict[str, Any] | None = None,
) -> Grid:
    """The grid of the reproduction: tasks × encodings × seeds at one preset."""
    if encodings is None:
        encodings = SMOKE_ENCODINGS if preset == "smoke" else [label for label, _ in ENCODINGS]
    by_label = dict(ENCODINGS)
    specs = [by_label.get(e, e) for e in encodings]
    n_seeds = DEFAULT_SEEDS.get(preset, 3) if seeds is None else seeds
    return parse_grid(
        {
            "name": f"reproduce-{preset}",
            "base": {"preset": preset, **(overrides or {})},
            "axes": {"task": list(tasks), "encoding": specs},
            "seeds": list(range(n_seeds)),
            "probes": list(PROBES),
        },
        source=f"reproduce --preset {preset}",
    )


def reproduce(
    out: str | Path,
    preset: str = "quick",
    seeds: int | None = None,
    encodings: list[str] | None = None,
    tasks: tuple[str, ...] = ("distance", "count"),
    backend: str = "local",
    workers: int | None = None,
    progress: bool = True,
    overrides: dict[str, Any] | None = None,
) -> tuple[SweepSummary, Path]:
    """Run (or finish) the reproduction into ``out`` and write ``summary.md`` and ``report.html``."""
    grid = reproduce_grid(preset, seeds, encodings, tasks, overrides)
    out = Path(out)
    summary = run_sweep(grid, out, backend=backend, workers=workers, progress=progress)
    write_report(out, preset=preset)
    return summary, out


__all__ = ["DEFAULT_SEEDS", "ENCODINGS", "PROBES", "SMOKE_ENCODINGS", "encoding_label", "reproduce", "reproduce_grid"]

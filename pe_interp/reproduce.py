"""``pe-interp reproduce``: the paper's runs and probes, then its tables and an offline report.

Runs go through the sweep runner (:mod:`pe_interp.sweep`), so a rerun skips finished work and a
failed run is reported rather than stopping the rest. Every model gets held-out accuracy, the
full head-ablation sweep with deposit detection, and deposit dynamics recorded during training;
task-1 models with a rotary part (multiplicative or hybrid) also get head patching with distance
counterfactuals and per-head positional scores; the heads the report shows get their attention
patterns stored; every model is scored on longer inputs than it was trained on (the
length-generalisation probe); and the sweep measures the gradient "seeds" at initialisation (C15).
The report then only reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_interp.report import write_report
from pe_interp.report.labels import ENCODINGS, encoding_label
from pe_interp.sweep import Grid, SweepSummary, parse_grid, run_sweep
from pe_interp.util.io import dir_lock

SMOKE_ENCODINGS = ["nope", "sinusoidal", "rope"]
DEFAULT_SEEDS = {"smoke": 1, "quick": 3, "paper": 3}
PROBES = (
    "dynamics",
    "ablation",
    "patching",
    "positional",
    "attention",
    "decomposition",
    "generalization",
    "gradients",
)


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


# ---- the ten-minute demo ---------------------------------------------------------------------------
# RoPE and two controls on task 1 at the quick size (where RoPE learns it), one seed each, with the
# probes that answer "is there a single-head deposit, and where?": the full ablation grid with
# deposit detection, head patching, positional scores, attention patterns and the top head's
# logit terms. No dynamics and no gradient seeds: those are the reproduction's (make reproduce).
DEMO_ENCODINGS = ["rope", "sinusoidal", "nope"]
DEMO_PROBES = ("ablation", "routes", "patching", "positional", "attention", "decomposition")
# The quick preset trained 4 epochs instead of 6 (384 steps instead of 576), and ablated on 1,000
# held-out examples instead of 2,000: a third less work, so that the demo fits in ten minutes on a
# loaded 2-core machine. RoPE still learns task 1 at this length (docs/commands.md, "`make demo`,
# in full").
DEMO_OVERRIDES = {"quick": {"epochs": 4}}
DEMO_PROBE_OPTIONS = {"ablation": {"n": 1000}}
# Committed checkpoints the demo opens up too: CHECKPOINTS/<name>/{config.json, model.safetensors},
# each trained by `pe-interp train` (config.json records the command and the seed). A name that
# starts with "planted-" is a constructed model (grids/planted_quick.yaml), shown first.
CHECKPOINTS = Path("checkpoints")


def demo_grid(preset: str = "quick", encodings: list[str] | None = None, seed: int = 0) -> Grid:
    """The demo's grid: task 1, ``encodings`` (default RoPE, sinusoidal, NoPE), one seed."""
    return parse_grid(
        {
            "name": f"demo-{preset}",
            "base": {"preset": preset, "task": "distance", **DEMO_OVERRIDES.get(preset, {})},
            "axes": {"encoding": list(encodings or DEMO_ENCODINGS)},
            "seeds": [seed],
            "probes": list(DEMO_PROBES),
            "probe_options": DEMO_PROBE_OPTIONS,
        },
        source=f"demo --preset {preset}",
    )


def committed_checkpoints(root: str | Path = CHECKPOINTS) -> list[Path]:
    """The run directories under ``root`` that hold a config and weights (sorted by name)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p.parent for p in root.glob("*/config.json") if (p.parent / "model.safetensors").is_file()
    )


def checkpoint_cell(
    source: str | Path,
    sweep_dir: str | Path,
    probes: tuple[str, ...] = DEMO_PROBES,
    options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Copy a committed run directory into ``sweep_dir`` as a cell of its own (params name the
    checkpoint) and run ``probes`` on it; the report then shows it with the other cells.
    Idempotent: a rerun only runs probes the cell lacks, unless the checkpoint's weights changed."""
    import shutil

    from pe_interp.config.presets import encoding_text
    from pe_interp.runs.checkpoint import WEIGHTS_KEY, load_run
    from pe_interp.sweep import CELL, RESULT, Cell, run_cell
    from pe_interp.training.trainer import evaluate
    from pe_interp.util.io import atomic_write_json, read_json

    source = Path(source)
    run = load_run(source)  # a one-line error if the committed files are broken
    config = run.config
    params = {
        "task": run.task.name,
        "encoding": encoding_text(run.model.cfg.encoding),
        "preset": config.get("preset"),
        "checkpoint": source.name,
    }
    cell = Cell(tuple(sorted(params.items())), int(run.train_cfg.seed))
    cell_dir = Path(sweep_dir) / "cells" / cell.id
    run_dir = cell_dir / "run"
    weights = (source / "model.safetensors").read_bytes()
    stale = (
        not (run_dir / "model.safetensors").is_file()
        or (run_dir / "model.safetensors").read_bytes() != weights
    )
    if stale:
        shutil.rmtree(cell_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "metrics.jsonl", "circuit.json"):
            if (source / name).is_file():
                shutil.copyfile(source / name, run_dir / name)
        metrics = run.metrics()
        if metrics:
            final = metrics[-1]
        else:
            m = evaluate(run.model, run.test_set(), ignore_index=run.train_cfg.ignore_index)
            final = {"test_acc": m["acc"], "test_loss": m["loss"]}
        atomic_write_json(
            cell_dir / CELL,
            {
                "id": cell.id,
                "params": params,
                "seed": cell.seed,
                "source": str(source),
                "command": config.get("command"),
            },
        )
        atomic_write_json(
            cell_dir / RESULT,
            {
                "id": cell.id,
                "params": params,
                "seed": cell.seed,
                "final": final,
                "probes_run": [],
                WEIGHTS_KEY: run.provenance,
            },
        )
    run_cell(cell, sweep_dir, probes, options=DEMO_PROBE_OPTIONS if options is None else options)
    return read_json(cell_dir / RESULT)


def demo(
    out: str | Path,
    preset: str = "quick",
    encodings: list[str] | None = None,
    checkpoints: str | Path | None = CHECKPOINTS,
    workers: int | None = None,
    progress: bool = True,
) -> tuple[SweepSummary, Path]:
    """Train and probe the demo's models (:func:`demo_grid`), open up every committed checkpoint
    (:func:`committed_checkpoints`), and write the report; returns the summary and the path of
    ``report.html``. Resumable like any sweep."""
    out = Path(out)
    grid = demo_grid(preset, encodings)
    # One process per cell, even above the core count: three cells on two cores then finish
    # together instead of the third running alone after the first two.
    workers = workers or len(grid.cells())
    with dir_lock(
        out, "sweep directory"
    ):  # the sweep, the checkpoint cells and the report: one writer
        summary = run_sweep(grid, out, workers=workers, progress=progress)
        failed = dict(summary.failed)
        for source in committed_checkpoints(checkpoints) if checkpoints is not None else []:
            try:
                checkpoint_cell(source, out)
            except (ValueError, OSError) as err:  # reported, like a failed cell; the demo goes on
                failed[f"checkpoint {source}"] = f"{type(err).__name__}: {err}"
        report = write_report(
            out,
            preset=preset,
            title=f"pe-interp demo: RoPE and controls on task 1 (preset {preset})",
        )
    return SweepSummary(
        done=summary.done, skipped=summary.skipped, failed=failed, recomputed=summary.recomputed
    ), report


__all__ = [
    "CHECKPOINTS",
    "DEFAULT_SEEDS",
    "DEMO_ENCODINGS",
    "DEMO_OVERRIDES",
    "DEMO_PROBES",
    "checkpoint_cell",
    "committed_checkpoints",
    "demo",
    "demo_grid",
    "ENCODINGS",
    "PROBES",
    "SMOKE_ENCODINGS",
    "encoding_label",
    "reproduce",
    "reproduce_grid",
]

"""``pe-interp validate``: does each probe find the positional routes that were planted?

Trains what is missing of the planted grid (``grids/planted_quick.yaml``, resumable: a cell
whose finding is committed is not trained again), builds each ``single_no`` model from its
``single_yes`` run (:func:`pe_interp.validate.mirror_head`), runs the probes that localise on
every model, scores them against the routes (:mod:`pe_interp.validate`), and writes
``findings/planted-quick/validation.json`` and, with ``--readme findings/README.md``, the table
there. A cell scored before keeps its record, so a fresh clone regenerates the table from the
committed file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

GRID = Path(__file__).resolve().parents[2] / "grids" / "planted_quick.yaml"
VALIDATION = "validation.json"
MIRROR = ((0, 3), (0, 5))  # single_no: L0H3 of a single_yes run mirrored into L0H5


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="score every localising probe against planted positional routes",
        description="Train the planted families (models whose positional routes are known by construction), run "
        "every probe that localises on them, and count per family how often each names a planted route or gives "
        "the verdict the construction implies (k of n cells, Wilson intervals).",
    )
    p.add_argument(
        "--grid", default=str(GRID), help="the planted grid (default grids/planted_quick.yaml)"
    )
    p.add_argument("--out", default=None, help="sweep directory (default runs/sweeps/<grid name>)")
    p.add_argument(
        "--workers", type=int, default=None, help="cells trained at once (default: one per core)"
    )
    p.add_argument(
        "--readme",
        default=None,
        help="write the table between the <!-- study:planted-quick begin/end --> markers of "
        "this file (findings/README.md)",
    )
    p.add_argument("--no-train", action="store_true", help="score only what is trained or recorded")
    p.add_argument(
        "--no-circuits",
        action="store_true",
        help="leave out circuit --faithful 0.9 (about a minute a model on 2 cores)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.report.findings import update_readme
    from pe_interp.sweep import load_grid, run_sweep
    from pe_interp.sweep.findings import has_finding
    from pe_interp.util.io import atomic_write_text
    from pe_interp.validate import dumps, validation_markdown

    grid = load_grid(args.grid)
    if grid.findings is None:
        raise ValueError(
            f"{args.grid}: a planted grid needs 'findings' (where validation.json is kept)"
        )
    sweep_dir = Path(args.out or f"runs/sweeps/{grid.name}")
    if not args.no_train:
        run_sweep(grid, sweep_dir, workers=args.workers)
    path = Path(grid.findings) / VALIDATION
    kept = {r["id"]: r for r in json.loads(path.read_text())["records"]} if path.is_file() else {}
    records: list[dict[str, Any]] = []
    path.parent.mkdir(parents=True, exist_ok=True)

    def add(
        record: dict[str, Any],
    ) -> None:  # saved after every model: a stopped call keeps what it scored
        records.append(record)
        atomic_write_text(
            path,
            dumps(records + [r for i, r in kept.items() if i not in {x["id"] for x in records}]),
        )

    for cell in grid.cells():
        run_dir = sweep_dir / "cells" / cell.id / "run"
        if (run_dir / "model.safetensors").is_file() and (
            sweep_dir / "cells" / cell.id / "result.json"
        ).is_file():
            record = _record_of(
                cell.id, cell.kwargs, run_dir, kept.get(cell.id), not args.no_circuits
            )
            add(record)
            if record["family"].startswith("single_yes"):
                mirrored = sweep_dir / "derived" / f"{cell.id}__mirror" / "run"
                if not (mirrored / "model.safetensors").is_file():
                    from pe_interp.validate import mirror_head

                    mirror_head(run_dir, mirrored, *MIRROR)
                add(
                    _record_of(
                        f"{cell.id}__mirror",
                        cell.kwargs,
                        mirrored,
                        kept.get(f"{cell.id}__mirror"),
                        not args.no_circuits,
                    )
                )
        elif cell.id in kept and has_finding(grid, cell):
            records.append(kept[cell.id])
            if f"{cell.id}__mirror" in kept:
                records.append(kept[f"{cell.id}__mirror"])
    if not records:
        raise ValueError(
            f"{sweep_dir}: no planted model is trained or recorded yet (run without --no-train)"
        )
    atomic_write_text(path, dumps(records))
    tasks = " and ".join(sorted({r["task"] for r in records}))
    block = validation_markdown(records, tasks)
    print(block)
    if args.readme:
        if not update_readme(args.readme, "planted-quick", block):
            raise ValueError(
                f"{args.readme}: no <!-- study:planted-quick begin --> / <!-- study:planted-quick end --> markers"
            )
        print(f"wrote {args.readme}")
    print(f"wrote {path} ({len(records)} models)")
    return 0


def _record_of(
    cell_id: str,
    params: dict[str, Any],
    run_dir: Path,
    kept: dict[str, Any] | None,
    circuits: bool = True,
) -> dict[str, Any]:
    """A cell's validation record: its routes, family, accuracy, every probe's ranking grid and
    every verdict (kept when it was computed from the same weights)."""
    from pe_interp.runs.checkpoint import load_run
    from probes import ablate_heads
    from probes.deposit.trajectory import PAIRS_SEED_OFFSET
    from probes.routes.shares import position_routes, route_shares

    run = load_run(run_dir)
    model, task, seed = run.model, run.task, run.train_cfg.seed
    routes = position_routes(model)[1]
    if kept is not None and kept.get("sha256") == run.provenance["sha256"]:
        if not circuits or not routes.any() or {"circuit", "aligned_circuit"} <= set(kept):
            return kept
        if "circuit" in kept:  # scored before the σ-aligned circuit existed: add it alone
            return {
                **kept,
                "aligned_circuit": _circuit_record(model, task, run, routes, aligned=True),
            }
    test = run.examples("test", 2000)
    a = ablate_heads(model, test.tokens, test.labels, pad_mask=test.pad_mask)
    rankings = _head_rankings(model, task, seed, test, a)
    pairs = task.counterfactuals(512, kind="position", seed=seed + PAIRS_SEED_OFFSET)
    shares = route_shares(
        model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.clean.pad_mask,
    )
    if routes.any():
        rankings["positional routes: top route"] = shares.shares
    record = _record(cell_id, params, run, routes, a, shares, rankings)
    if circuits and routes.any():
        record["circuit"] = _circuit_record(model, task, run, routes)
        record["aligned_circuit"] = _circuit_record(model, task, run, routes, aligned=True)
    return record


def _head_rankings(model, task, seed: int, test, a) -> dict[str, Any]:
    """Each head-level probe's grid: exact ablation (``a``), attribution, head patching on the
    three kinds of pairs whose labels differ, and the decomposition's two positional scores."""
    from probes import ablate_heads, patch, positional_scores
    from probes.ablation import Attribution

    attribution = ablate_heads(
        model,
        test.tokens[:500],
        test.labels[:500],
        pad_mask=test.pad_mask[:500],
        engine=Attribution(verify_top=1),
        n_bootstrap=0,
    )
    rankings = {
        "exact ablation: top head": a.drops,
        "attribution ranking: top head": attribution.drops,
    }
    for kind, label in (
        ("position", "position pairs"),
        ("content", "content pairs"),
        ("both", "both changed"),
    ):
        pairs = task.counterfactuals(256, kind=kind, seed=seed + 7919)
        if bool((pairs.clean.labels != pairs.corrupt.labels).any()):
            p = patch(
                model,
                pairs.clean.tokens,
                pairs.corrupt.tokens,
                site="z",
                pad_mask=pairs.clean.pad_mask,
                clean_labels=pairs.clean.labels,
                corrupt_labels=pairs.corrupt.labels,
                n_bootstrap=0,
            )
            rankings[f"head patching, {label}: top head"] = p.values.abs().numpy()
    scores = positional_scores(model, test.tokens[:128], pad_mask=test.pad_mask[:128])
    rankings["decomposition: most positional head"] = scores.scores
    rankings["decomposition: where position enters"] = scores.direct
    return rankings


def _record(
    cell_id: str, params: dict[str, Any], run, routes, a, shares, rankings
) -> dict[str, Any]:
    """The record of one scored model: what it is, its rankings and its verdicts."""
    from pe_interp.validate import family_of
    from probes import find_concentrations
    from probes.deposit import dominance
    from probes.deposit.positional import positional_dominance

    task = run.task
    concentrated = find_concentrations(a).layer(0).is_concentrated
    return {
        "id": cell_id,
        "params": params,
        "task": task.name,
        "seed": run.train_cfg.seed,
        "sha256": run.provenance["sha256"],
        "test_acc": float(run.metrics()[-1]["test_acc"]) if run.metrics() else a.baseline,
        "routes": routes.astype(int).tolist(),
        "family": family_of(params, routes),
        "blind_ceiling": float(getattr(task, "content_only_accuracy", task.length_only_accuracy)()),
        "rankings": {k: [[float(x) for x in row] for row in v] for k, v in rankings.items()},
        "verdicts": {
            "single-head deposit (paper)": "yes" if dominance(a).single else "no",
            "positional deposit": positional_dominance(shares).verdict,
            "layer-0 concentration": "yes" if concentrated else "no",
        },
        "top_drop": float(dominance(a).drop),
        "positional_effect": shares.effect,
    }


def _circuit_record(model, task, run, routes, aligned: bool = False) -> dict[str, Any]:
    """``circuit --faithful 0.9`` (default EAP-IG, paths), or σ-aligned (``--method atp
    --aligned``, top units): recall of the planted heads, its size, faithfulness, its head writers."""
    from pe_interp.commands.circuit import circuit_run

    how = {"method": "atp", "aligned": True} if aligned else {}
    c, _ = circuit_run(model, task, run, faithful=0.9, **how)
    planted = {f"L{a}H{b}" for a, b in zip(*routes.nonzero())}
    heads = sorted({w for w, _ in c.edges if w.startswith("L")})
    return {
        "recall": len(planted & set(c.nodes)) / len(planted),
        "edges": len(c.edges),
        "total_edges": c.total_edges,
        "faithfulness": (c.faithfulness or {}).get("kept"),
        "heads": heads,
    }

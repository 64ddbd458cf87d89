"""Findings: one small JSON summary per finished cell, committed with the code.

A sweep's run directories stay on the machine that trained them; a study that spans sessions and
machines needs its results to outlive them. A grid with ``findings: DIR`` (relative to the grid
file) writes ``DIR/<cell id>.json`` when a cell has trained and run its probes: everything the
study table, the dynamics figure and the verdict are made of, a few KB per cell. A cell whose
finding is there, made with the grid's probes and probe options, is finished, also on a machine
that never had its run directory: ``pe-interp sweep`` does not train it again.

A finding's keys (``FINDING_KEYS``): ``condition`` (how the cell differs from the grid's base:
"base" or ``key=value, ...``), ``seed``, ``test_acc`` (final held-out accuracy), ``drops``
(``[n_layers][n_heads]`` accuracy drops of zero-ablating each head, on ``n_examples`` held-out
examples) with ``ci_low``/``ci_high`` (paired bootstrap), ``layer_drops`` with their CIs (every
head of a layer ablated together, when the probe ran so), ``dynamics`` (the layer-0 drops over
training, on held-out examples), ``snapshots`` (every criterion at every training snapshot, when the
grid keeps snapshots and runs ``snapshot_dynamics``: :mod:`probes.deposit.trajectory`), ``history`` (held-out accuracy per evaluation), ``weights``
(sha256 of ``model.safetensors`` and the step), ``seconds``, ``machine``, ``threads`` and
``attn_route`` (per stage, :mod:`pe_interp.sweep.pinning`), ``probe_options``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pe_interp.sweep.grid import Cell, Grid
from pe_interp.util.io import atomic_write_json, read_json, read_jsonl
from probes import AblationResult

__all__ = [
    "FINDING_KEYS",
    "ablation_of",
    "finding_path",
    "has_finding",
    "layer_ablation_of",
    "load_findings",
    "summarize",
    "write_finding",
]

FORMAT = 1
FINDING_KEYS = (
    "condition",
    "seed",
    "test_acc",
    "drops",
    "ci_low",
    "ci_high",
    "layer_drops",
    "dynamics",
    "weights",
)
# ablation fields stored flat (the AblationResult is rebuilt from them by ablation_of)
_ABLATION_FIELDS = (
    "baseline",
    "values",
    "drops",
    "ci_low",
    "ci_high",
    "method",
    "metric",
    "higher_is_better",
    "n_examples",
    "n_layers",
    "n_heads",
    "n_bootstrap",
    "ci",
    "seed",
)


def finding_path(grid: Grid, cell: Cell) -> Path | None:
    return None if grid.findings is None else Path(grid.findings) / f"{cell.id}.json"


def _recipe(grid: Grid) -> dict[str, Any]:
    """What a finding must have been made with to count for this grid."""
    return {
        "probes": sorted(grid.probes),
        "probe_options": json.loads(json.dumps(grid.probe_options, sort_keys=True)),
    }


def has_finding(grid: Grid, cell: Cell) -> bool:
    """A finding of this cell made with this grid's probes and probe options."""
    path = finding_path(grid, cell)
    if path is None or not path.is_file():
        return False
    found = read_json(path)
    return found.get("params") == json.loads(json.dumps(cell.kwargs)) and found.get(
        "recipe"
    ) == _recipe(grid)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def summarize(grid: Grid, cell: Cell, result: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The finding of a finished cell from its ``result.json`` record and run directory."""
    run_dir = Path(run_dir)
    ablation = (result.get("ablation") or {}).get("ablation") or {}
    layers = (result.get("ablation") or {}).get("layers")
    metrics = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    dynamics = (
        read_jsonl(run_dir / "deposit_dynamics.jsonl")
        if (run_dir / "deposit_dynamics.jsonl").is_file()
        else []
    )
    final = result.get("final", {})
    out: dict[str, Any] = {
        "format": FORMAT,
        "grid": grid.name,
        "id": cell.id,
        "condition": grid.condition(cell),
        "seed": cell.seed,
        "params": cell.kwargs,
        "recipe": _recipe(grid),
        "test_acc": final.get("test_acc"),
        "final": final,
        **{k: ablation.get(k) for k in _ABLATION_FIELDS if k != "seed"},
        "bootstrap_seed": ablation.get("seed"),
        "layer_drops": None if layers is None else layers["drops"],
        "layer_ci_low": None if layers is None else layers["ci_low"],
        "layer_ci_high": None if layers is None else layers["ci_high"],
        "layer_values": None if layers is None else layers["values"],
        "dynamics": [
            {k: r[k] for k in ("step", "layer", "baseline", "drops", "n_probe", "metric")}
            for r in dynamics
        ],
        "history": [
            {k: m.get(k) for k in ("step", "test_acc", "test_loss", "train_loss", "lr")}
            for m in metrics
        ],
        "positional": (result.get("positional") or {}).get("scores"),
        "routes": _routes(result.get("routes")),
        "snapshots": _rounded((result.get("snapshot_dynamics") or {}).get("records")),
        "weights": {"sha256": _sha256(run_dir / "model.safetensors"), "step": final.get("step")}
        if (run_dir / "model.safetensors").is_file()
        else None,
        "seconds": result.get("seconds"),
        "machine": result.get("machine"),
        # what each stage computed with (pe_interp.sweep.pinning); None before it was recorded
        "threads": result.get("threads"),
        "attn_route": result.get("attn_route"),
    }
    return out


def _routes(r: dict[str, Any] | None) -> dict[str, Any] | None:
    """The positional criterion of a cell (``routes`` probe): its verdict and the numbers behind it."""
    if not r:
        return None
    keep = (
        "verdict",
        "why",
        "top",
        "effect",
        "effect_ci",
        "shares",
        "ci_low",
        "ci_high",
        "embed",
        "embed_ci",
        "counterfactual_effect",
        "identity_gap",
        "n_examples",
    )
    return _rounded({k: r.get(k) for k in keep})


def _rounded(x: Any, digits: int = 5) -> Any:
    """``x`` with floats to ``digits`` significant digits (a finding stays a few hundred KB)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, list):
        return [_rounded(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    return x


def write_finding(grid: Grid, cell: Cell, result: dict[str, Any], run_dir: Path) -> Path | None:
    """Write the cell's finding (atomically) when the grid names a findings directory."""
    path = finding_path(grid, cell)
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, summarize(grid, cell, result, run_dir), indent=None)


def load_findings(directory: str | Path) -> list[dict[str, Any]]:
    """Every finding in ``directory``, ordered by condition then seed."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: no findings directory")
    found = [read_json(p) for p in sorted(directory.glob("*.json"))]
    bad = [f.get("id", "?") for f in found if not isinstance(f, dict) or f.get("format") != FORMAT]
    if bad:
        raise ValueError(
            f"{directory}: {len(bad)} file(s) are not findings of format {FORMAT} (e.g. {bad[0]})"
        )
    return sorted(found, key=lambda f: (f["condition"], f["seed"]))


def ablation_of(finding: dict[str, Any]) -> AblationResult | None:
    """The single-head ablation grid of a finding (None when the cell had no ablation probe)."""
    if finding.get("drops") is None:
        return None
    d = {k: finding[k] for k in _ABLATION_FIELDS if k != "seed"}
    return AblationResult.from_dict(
        {**d, "seed": finding.get("bootstrap_seed", 0), "head_sets": None}
    )


def layer_ablation_of(finding: dict[str, Any]) -> AblationResult | None:
    """Each layer's heads ablated together (None when not measured): one entry per layer."""
    if finding.get("layer_drops") is None:
        return None
    n_layers, n_heads = int(finding["n_layers"]), int(finding["n_heads"])
    sets = [[[layer, h] for h in range(n_heads)] for layer in range(n_layers)]
    return AblationResult.from_dict(
        {
            "baseline": finding["baseline"],
            "values": finding["layer_values"],
            "drops": finding["layer_drops"],
            "ci_low": finding["layer_ci_low"],
            "ci_high": finding["layer_ci_high"],
            "method": finding["method"],
            "metric": finding["metric"],
            "higher_is_better": finding["higher_is_better"],
            "n_examples": finding["n_examples"],
            "n_layers": n_layers,
            "n_heads": n_heads,
            "n_bootstrap": finding["n_bootstrap"],
            "ci": finding["ci"],
            "seed": finding.get("bootstrap_seed", 0),
            "head_sets": sets,
        }
    )

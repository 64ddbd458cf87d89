"""Per-model points of the generalisation study: what each model's stored results say (issue 23).

:func:`load_points` reads, per finished cell, the single-head ablation grid, ``layer_ablation.json``
and ``generalization.json`` into a :class:`ModelPoint`; :func:`concentration` condenses the
ablations into a :class:`Concentration` (top layer-0 head's drop and share, layer-0 cost, that
head's positional score, single-head deposit). The measures are described in
:mod:`pe_interp.report.generalization`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.report.data import CellInfo, dominance
from probes import AblationResult, GeneralizationResult

__all__ = [
    "CONCENTRATION",
    "GENERALIZATION",
    "LAYER_ABLATION",
    "MEASURES",
    "Concentration",
    "ModelPoint",
    "concentration",
    "layer0_cost",
    "load_points",
    "points_from",
]


GENERALIZATION, LAYER_ABLATION = "generalization.json", "layer_ablation.json"
CONCENTRATION = ("top L0 drop", "top L0 share", "L0 cost", "top L0 positional")
MEASURES = ("retention, translated", "retention, 2x length")


@dataclass(frozen=True)
class Concentration:
    head: int  # the top layer-0 head
    drop: float
    share: float
    layer0_cost: float  # NaN: no whole-layer ablation stored
    positional: float  # NaN: no positional scores stored
    single: bool
    top: tuple[int, int, float]  # the model's top head (layer, head, drop)

    def value(self, name: str) -> float:
        return {
            "top L0 drop": self.drop,
            "top L0 share": self.share,
            "L0 cost": self.layer0_cost,
            "top L0 positional": self.positional,
        }[name]


def layer0_cost(layers: AblationResult | None, n_heads: int) -> float:
    """The drop of the stored head set that is all of layer 0 (NaN if there is none)."""
    if layers is None or layers.head_sets is None:
        return math.nan
    whole = tuple((0, h) for h in range(n_heads))
    for i, heads in enumerate(layers.head_sets):
        if tuple(sorted(map(tuple, heads))) == whole:
            return float(layers.drops[i])
    return math.nan


def concentration(
    ablation: AblationResult, layers: AblationResult | None = None, positional: Any | None = None
) -> Concentration:
    """:class:`Concentration` from a single-head ablation grid (and, where stored, the
    whole-layer ablation and the positional scores)."""
    drops0 = np.nan_to_num(ablation.drops[0], nan=-math.inf)
    head = int(np.argmax(drops0))
    drop = float(ablation.drops[0, head])
    pos = np.clip(np.nan_to_num(ablation.drops[0], nan=0.0), 0.0, None)
    share = float(pos[head] / pos.sum()) if pos.sum() > 0 else math.nan
    score = math.nan if positional is None else float(positional.scores[0, head])
    d = dominance(ablation)
    return Concentration(
        head,
        drop,
        share,
        layer0_cost(layers, ablation.n_heads),
        score,
        d.single,
        (d.layer, d.head, d.drop),
    )


@dataclass(frozen=True)
class ModelPoint:
    """One trained model: where it comes from, its concentration and its generalisation."""

    source: str
    cell: CellInfo
    conc: Concentration | None
    gen: GeneralizationResult | None

    @property
    def room(self) -> bool:
        return self.cell.ablation is not None and dominance(self.cell.ablation).room

    def measure(self, name: str) -> float:
        """A :data:`MEASURES` value (NaN where not evaluated)."""
        g = self.gen
        if g is None or not g.trained.evaluated or g.trained.accuracy == 0:
            return math.nan
        families = g.families
        if name == MEASURES[0]:
            acc = g.family_mean(families[0])
        else:
            wide = "sides" if "sides" in families else families[0]
            extras = [c.extra for c in g.conditions if c.family == wide]
            acc = g.condition(wide, max(extras)).accuracy if extras else math.nan
        return acc / g.trained.accuracy


def _fresh(cell: CellInfo, name: str) -> bool:
    """The result file is there and of the run's weights; a stale one is left out and named in
    ``cell.extra["stale"]``, as :func:`~pe_interp.report.data.load_run_cell` does."""
    from pe_interp.runs.checkpoint import STALE, weights_status

    path = cell.run_dir / name
    if not path.is_file():
        return False
    status, why = weights_status(cell.run_dir, path)
    if status == STALE:
        cell.extra.setdefault("stale", {})[name] = why
    return status != STALE


def load_points(cells: list[CellInfo], source: str) -> list[ModelPoint]:
    points = []
    for c in cells:
        layers = (
            AblationResult.load(c.run_dir / LAYER_ABLATION) if _fresh(c, LAYER_ABLATION) else None
        )
        gen = (
            GeneralizationResult.load(c.run_dir / GENERALIZATION)
            if _fresh(c, GENERALIZATION)
            else None
        )
        conc = concentration(c.ablation, layers, c.positional) if c.ablation is not None else None
        points.append(ModelPoint(source, c, conc, gen))
    return points


def points_from(dirs: dict[str, str | Path]) -> list[ModelPoint]:
    """Every finished cell of each ``{source: sweep_dir}``."""
    from pe_interp.report.data import load_cells

    points = []
    for source, d in dirs.items():
        cells, _ = load_cells(d)
        points += load_points(cells, source)
    return points

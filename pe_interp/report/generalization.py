"""Length generalisation, concentration, and the link between them (issue 23), from stored results.

Per model it reads what the probes stored in the run directory: the single-head ablation grid
(the cell's ``ablation`` record), every layer ablated whole (``layer_ablation.json``), the
positional scores, and ``generalization.json``. Nothing here runs a model.

Concentration of a model (:func:`concentration`), all on held-out data:

- the **top layer-0 head**'s accuracy drop when ablated alone, and its **share** of layer 0's
  summed positive single-head drops;
- the **layer-0 cost**: the drop with all of layer 0's heads ablated together;
- the **positional score** of that head (:class:`probes.PositionalScores`);
- whether the model has a **single-head deposit** (:func:`pe_interp.report.data.dominance`, the
  project's one definition: exactly one head of the model ≥ 50 points, every other ≤ 5).

Generalisation of a model (:data:`MEASURES`): accuracy on the primary family's longer inputs
(task 1 and 3: the translated ``shift`` conditions; task 2: ``length``), averaged over its
extras, and accuracy at twice the training length (``sides``; task 2: ``length``), each divided
by the model's in-range accuracy on the same stream (*retention*: 1 = nothing lost), so that a
model is not credited for generalising merely by being accurate.

The link (:func:`link_table`): Spearman's rank correlation between each concentration measure
and each generalisation measure over the models that learned their task (in-range accuracy ≥ 50%,
:attr:`~pe_interp.report.data.Dominance.room`), with a percentile bootstrap interval over models.
These choices were fixed before any model was scored.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.report.data import TASK_TITLES, CellInfo, dominance, label_order, task_order
from pe_interp.report.summary import Table
from probes import AblationResult, GeneralizationResult
from probes.generalization import TRAINED
from probes.metrics import wilson

GENERALIZATION, LAYER_ABLATION = "generalization.json", "layer_ablation.json"
CONCENTRATION = ("top L0 drop", "top L0 share", "L0 cost", "top L0 positional")
MEASURES = ("retention, translated", "retention, 2x length")
N_BOOTSTRAP, CI = 2000, 0.95


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
    from pe_interp.checkpoint import STALE, weights_status

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


def _pm(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return "—"
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{scale * statistics.fmean(v):.{digits}f} ± {scale * sd:.{digits}f}"


def _rate(k: int, n: int) -> str:
    """``k of n`` with its 95% Wilson interval."""
    lo, hi = wilson(k, n) if n else (math.nan, math.nan)
    return f"{k} of {n} [{100 * lo:.0f}, {100 * hi:.0f}]%"


def _settings(points: list[ModelPoint]) -> list[tuple[str, str]]:
    """(source, label) of every setting, sources in order of appearance, labels in table order."""
    order = label_order([p.cell for p in points])
    sources = list(dict.fromkeys(p.source for p in points))
    present = {(p.source, p.cell.label) for p in points}
    return [(s, lab) for s in sources for lab in order if (s, lab) in present]


def _columns(points: list[ModelPoint]) -> list[tuple[str, int]]:
    """The conditions a task's table shows: the trained one, every extra of the primary family, and
    the largest extra of each other family."""
    gens = [p.gen for p in points if p.gen is not None]
    if not gens:
        return []
    g = gens[0]
    families = g.families
    out = [(TRAINED, 0)] + [(c.family, c.extra) for c in g.conditions if c.family == families[0]]
    for f in families[1:]:
        out.append((f, max(c.extra for c in g.conditions if c.family == f)))
    return out


def generalization_tables(points: list[ModelPoint]) -> list[Table]:
    """One table per task: accuracy (%) per condition, mean ± std over seeds, per encoding."""
    tables = []
    cells = [p.cell for p in points]
    for task in task_order(cells):
        pts = [p for p in points if p.cell.task == task and p.gen is not None]
        cols = _columns(pts)
        if not cols:
            continue
        g0 = pts[0].gen
        head = [
            f"{f} +{e}" if f != TRAINED else f"in range (≤ {g0.trained.max_len})" for f, e in cols
        ]
        rows, records = [], []
        for source, label in _settings(pts):
            group = sorted(
                (p for p in pts if (p.source, p.cell.label) == (source, label)),
                key=lambda p: p.cell.seed,
            )
            row = [label, group[0].source, str(len(group))]
            rec: dict[str, Any] = {
                "task": task,
                "label": label,
                "source": group[0].source,
                "seeds": [p.cell.seed for p in group],
            }
            for (f, e), name in zip(cols, head):
                accs = [p.gen.condition(f, e).accuracy for p in group]
                row.append(_pm(accs))
                rec[name] = accs
            unrepresentable = any(p.gen.unrepresentable for p in group)
            row.append(
                "not evaluated beyond n_ctx (a trained parameter per position)"
                if unrepresentable
                else ""
            )
            rows.append(row)
            records.append(rec)
        conds = {(c.family, c.extra): c for c in g0.conditions}
        base = conds[(TRAINED, 0)]
        notes = [
            f"Chance {100 * base.chance:.2f}%, length-only ceiling {100 * base.length_only:.2f}% "
            "(exact, of the trained task; the same for every condition"
            + (
                ""
                if all(abs(c.length_only - base.length_only) < 1e-12 for c in g0.conditions)
                else " except where the lengths change the joint law"
            )
            + "). "
            f"{g0.meta.get('n', '?')} fresh rows per condition per model, none of them a training row. "
            "`shift +k`: k more fillers before the decisive tokens (translated by k); `sides +k`: k/2 "
            "before and k/2 after; `right +k`: k after; `length +k`: k more tokens, counts in the trained "
            "range. `—`: not evaluated (the encoding has a trained parameter per position)."
        ]
        tables.append(
            Table(
                f"generalization-{task}",
                f"Length generalisation: {TASK_TITLES.get(task, task)}",
                ["encoding", "source", "seeds", *head, "note"],
                rows,
                records,
                notes,
            )
        )
    return tables


def concentration_table(points: list[ModelPoint]) -> Table:
    """Per task and encoding: accuracy and the concentration measures, mean ± std over seeds."""
    rows, records = [], []
    cells = [p.cell for p in points]
    for task in task_order(cells):
        for source, label in _settings([p for p in points if p.cell.task == task]):
            group = sorted(
                (
                    p
                    for p in points
                    if p.cell.task == task
                    and (p.source, p.cell.label) == (source, label)
                    and p.conc
                ),
                key=lambda p: p.cell.seed,
            )
            if not group:
                continue
            cs = [p.conc for p in group]
            tops = ", ".join(f"L{c.top[0]}H{c.top[1]} ({100 * c.top[2]:.1f})" for c in cs)
            flagged = sum(bool(p.cell.flagged) for p in group)
            rows.append(
                [
                    TASK_TITLES.get(task, task),
                    label,
                    group[0].source,
                    str(len(group)),
                    _pm([p.cell.test_acc for p in group]),
                    _rate(sum(c.single for c in cs), len(cs)),
                    tops,
                    _pm([c.drop for c in cs]),
                    _pm([c.share for c in cs]),
                    _pm([c.layer0_cost for c in cs]),
                    _pm([c.positional for c in cs], 1.0, 2),
                    f"{flagged} of {len(group)}",
                ]
            )
            records.append(
                {
                    "task": task,
                    "label": label,
                    "seeds": [p.cell.seed for p in group],
                    "acc": [p.cell.test_acc for p in group],
                    "single": [c.single for c in cs],
                    "top": [list(c.top) for c in cs],
                    "top_l0_drop": [c.drop for c in cs],
                    "top_l0_share": [c.share for c in cs],
                    "l0_cost": [c.layer0_cost for c in cs],
                    "top_l0_positional": [c.positional for c in cs],
                }
            )
    notes = [
        "Drops in accuracy points on held-out data. Single-head deposit: the project's one definition "
        "(exactly one head of the model ≥ 50 points, every other ≤ 5), k of n seeds with a 95% Wilson interval. Top head: the model's "
        "most harmful head per seed (drop). Share: the top layer-0 head's part of layer 0's summed positive "
        "single-head drops. L0 cost: all of layer 0 ablated together. Positional: the top layer-0 head's "
        "positional score (split-half R² of a position-only logit template). Layer concentration: seeds with a "
        "concentrated layer, any layer (`probes.find_concentrations`: top head ≥ 20 points, ≥ 50% of its layer, "
        "CI-separated)."
    ]
    return Table(
        "concentration",
        "Concentration per encoding (held-out ablation)",
        [
            "task",
            "encoding",
            "source",
            "seeds",
            "acc %",
            "single-head deposit",
            "top head (drop, pts)",
            "top L0 drop (pts)",
            "top L0 share %",
            "L0 cost (pts)",
            "top L0 positional",
            "layer concentration",
        ],
        rows,
        records,
        notes,
    )


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_ci(
    x: np.ndarray, y: np.ndarray, n_bootstrap: int = N_BOOTSTRAP, ci: float = CI, seed: int = 0
) -> tuple[float, float, float]:
    """(rho, low, high): Spearman's rho and a percentile bootstrap interval over pairs."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = spearman(x, y)
    rng = np.random.default_rng(seed)
    reps = [
        spearman(x[i], y[i]) for i in (rng.integers(0, len(x), len(x)) for _ in range(n_bootstrap))
    ]
    reps = np.array([r for r in reps if not math.isnan(r)])
    if len(x) < 4 or len(reps) < n_bootstrap // 2:
        return rho, math.nan, math.nan
    a = (1 - ci) / 2
    return rho, float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


def link_pairs(
    points: list[ModelPoint], task: str, conc: str, measure: str
) -> list[tuple[float, float, ModelPoint]]:
    out = []
    for p in points:
        if p.cell.task != task or p.conc is None or not p.room:
            continue
        x, y = p.conc.value(conc), p.measure(measure)
        if not (math.isnan(x) or math.isnan(y)):
            out.append((x, y, p))
    return out


def _link_row(
    task: str, group: str, measure: str, conc: str, pairs: list
) -> tuple[list[str], dict[str, Any]]:
    x, y = np.array([a for a, _, _ in pairs]), np.array([b for _, b, _ in pairs])
    rho, lo, hi = spearman_ci(x, y)
    settings = len({(p.source, p.cell.label) for _, _, p in pairs})
    if math.isnan(lo):
        verdict = "not measurable (too few models, or no spread)"
    elif lo > 0 or hi < 0:
        verdict = f"{'positive' if rho > 0 else 'negative'} (the interval excludes 0)"
    else:
        verdict = "none detected (the interval includes 0)"
    row = [
        TASK_TITLES.get(task, task),
        group,
        measure,
        conc,
        f"{len(pairs)} ({settings} settings)",
        "—" if math.isnan(rho) else f"{rho:+.2f}",
        "—" if math.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}]",
        verdict,
    ]
    record = {
        "task": task,
        "group": group,
        "measure": measure,
        "concentration": conc,
        "n": len(pairs),
        "rho": rho,
        "ci": [lo, hi],
        "points": [[a, b, p.source, p.cell.label, p.cell.seed] for a, b, p in pairs],
    }
    return row, record


def link_table(points: list[ModelPoint]) -> Table:
    """Per task, per group of models (each source alone, then all together when there are
    several), per generalisation and concentration measure: Spearman's rho and its interval."""
    rows, records = [], []
    for task in task_order([p.cell for p in points]):
        sources = sorted({p.source for p in points if p.cell.task == task})
        groups = [(s, [p for p in points if p.source == s]) for s in sources]
        if len(sources) > 1:
            groups.append(("all", points))
        before = len(rows)
        for group, members in groups:
            for measure in MEASURES:
                for conc in CONCENTRATION:
                    pairs = link_pairs(members, task, conc, measure)
                    if len(pairs) >= 4:
                        row, record = _link_row(task, group, measure, conc, pairs)
                        rows.append(row)
                        records.append(record)
        if len(rows) == before:  # say so, rather than leave the task out
            mine = [p for p in points if p.cell.task == task]
            learned = sum(p.room for p in mine)
            rows.append(
                [
                    TASK_TITLES.get(task, task),
                    ", ".join(sources),
                    "—",
                    "—",
                    f"{learned} of {len(mine)} learned",
                    "—",
                    "—",
                    "not measured: fewer than 4 models that learned the task (in-range accuracy ≥ 50%) "
                    "have both measures",
                ]
            )
    notes = [
        f"Spearman's rank correlation over models that learned their task (in-range accuracy ≥ 50%), with a "
        f"{int(100 * CI)}% percentile bootstrap interval over models ({N_BOOTSTRAP} resamples, seed 0). "
        "Retention: accuracy on the longer inputs divided by in-range accuracy on the same stream; "
        "`translated`: mean over the primary family's extras (tasks 1 and 3: shift; task 2: length); `2x "
        "length`: the sides condition at twice the training length (task 2: length). Encodings whose "
        "parameters have one entry per position are not evaluated beyond n_ctx and are not in this "
        "table. Across encodings, a correlation can reflect the encodings rather than concentration."
    ]
    return Table(
        "link",
        "Does concentration predict length generalisation?",
        [
            "task",
            "models",
            "generalisation",
            "concentration",
            "n",
            "Spearman ρ",
            "95% CI",
            "verdict",
        ],
        rows,
        records,
        notes,
    )


def link_scatter(link: Table, task: str = "distance") -> str | None:
    """Retention on translated inputs against each concentration measure, one panel each, from the
    points stored in the link table's records."""
    from pe_interp.report.figures import new_figure, to_data_uri

    panels = [r for r in link.records if r["task"] == task and r["measure"] == MEASURES[0]]
    groups = {r["group"] for r in panels}
    panels = [r for r in panels if r["group"] == ("all" if "all" in groups else r["group"])]
    if not panels or len({r["group"] for r in panels}) > 1:
        return None
    fig = new_figure(3.0 * len(panels) + 1.8, 3.2)
    labels = sorted({pt[3].split(" [")[0] for r in panels for pt in r["points"]})
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    markers = {"quick": "o", "mid": "^"}
    for i, r in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for x, y, source, label, _seed in r["points"]:
            lab = label.split(" [")[0]
            ax.scatter(
                x,
                y,
                color=colors[lab],
                marker=markers.get(source, "s"),
                s=28,
                alpha=0.85,
                label=f"{lab} ({source})",
            )
        lo, hi = r["ci"]
        ci = "" if lo is None or math.isnan(lo) else f" [{lo:+.2f}, {hi:+.2f}]"
        ax.set_title(f"ρ = {r['rho']:+.2f}{ci}, n = {r['n']}", fontsize=8)
        ax.set_xlabel(r["concentration"])
        if i == 0:
            ax.set_ylabel(MEASURES[0])
        ax.axhline(1.0, color="#999", lw=0.6, ls=":")
    seen: dict[str, Any] = {}
    for ax in fig.axes:
        for h, n in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(n, h)
    fig.legend(list(seen.values()), list(seen.keys()), loc="outside right center", fontsize=7)
    return to_data_uri(fig)


def points_from(dirs: dict[str, str | Path]) -> list[ModelPoint]:
    """Every finished cell of each ``{source: sweep_dir}``."""
    from pe_interp.report.data import load_cells

    points = []
    for source, d in dirs.items():
        cells, _ = load_cells(d)
        points += load_points(cells, source)
    return points


__all__ = [
    "CONCENTRATION",
    "MEASURES",
    "Concentration",
    "ModelPoint",
    "concentration",
    "concentration_table",
    "generalization_tables",
    "layer0_cost",
    "link_scatter",
    "link_table",
    "load_points",
    "points_from",
    "spearman",
    "spearman_ci",
]

"""The deposit over training: every criterion at every snapshot of a run.

A run trained with ``snapshots="log"`` keeps its weights at steps 0, 1, 2, 4, ... and every few
steps after (:mod:`pe_interp.runs.snapshots`). :func:`snapshot_dynamics` walks them and, at each step,
computes the whole model's single-head zero-ablation grid on the same first ``n`` held-out
examples (the examples ``ablate`` uses), the three verdicts decided on their intervals
(:mod:`probes.deposit.decision`): the single-head deposit, layer-0 concentration and the
positional deposit (:mod:`probes.routes.shares`, on the same position-only counterfactual pairs
at every step). A step where any verdict is not a clear "no" on the screening set is measured
again on ``n_confirm`` examples (and pairs), and that record replaces the screen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pe_interp.runs.checkpoint import load_run
from pe_interp.runs.snapshots import read_manifest
from pe_interp.util.io import load_result, register_result, to_json, write_result
from probes.ablation import ablate_heads
from probes.deposit.decision import NO, decide_concentration, decide_single
from probes.deposit.positional import positional_dominance
from probes.routes.shares import NO_EFFECT, can_move_positions, route_shares

RESULT_KIND = register_result("snapshot dynamics", "SnapshotDynamics.load", ("records", "options"))
PAIRS_SEED_OFFSET = (
    7_717  # the pairs are task.counterfactuals(n, "position", seed=train seed + this)
)
# An open positional verdict is re-measured on this many pairs (since the routes run as
# replacements in the ablation sweep, 512 pairs cost about half the 1,000-example ablation grid).
PAIRS_CONFIRM = 512

__all__ = [
    "Snapshot",
    "SnapshotDynamics",
    "measure_ablation",
    "measure_routes",
    "measure_step",
    "snapshot_dynamics",
    "walk_snapshots",
]


@dataclass(frozen=True, eq=False)
class SnapshotDynamics:
    """What :func:`snapshot_dynamics` returns: one record per snapshot, by step (see
    :func:`measure_step` for a record's keys), and the options they were computed with."""

    records: tuple[dict[str, Any], ...]
    options: dict[str, Any]

    @property
    def steps(self) -> list[int]:
        return [r["step"] for r in self.records]

    def holds(self, criterion: str) -> list[int]:
        """The steps at which ``criterion`` (``single_head``, ``layer0`` or ``positional``) is "yes"."""
        return [r["step"] for r in self.records if r["verdicts"][criterion]["verdict"] == "yes"]

    def to_dict(self) -> dict[str, Any]:
        return {"options": to_json(self.options), "records": [to_json(r) for r in self.records]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SnapshotDynamics:
        return cls(tuple(d["records"]), dict(d["options"]))

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | Path) -> SnapshotDynamics:
        return load_result(path, RESULT_KIND, cls.from_dict)


def measure_ablation(run, n: int, n_bootstrap: int = 1000) -> dict[str, Any]:
    """The ablation part of a record: the grid on the first ``n`` held-out examples and the
    single-head and layer-0 verdicts decided on it."""
    test = run.examples("test", n)
    a = ablate_heads(
        run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=n_bootstrap
    )
    return to_json(
        {
            "n_examples": a.n_examples,
            "baseline": a.baseline,
            "drops": a.drops,
            "ci_low": a.ci_low,
            "ci_high": a.ci_high,
            "verdicts": {
                "single_head": decide_single(a).to_dict(),
                "layer0": decide_concentration(a, 0).to_dict(),
            },
        }
    )


def measure_routes(run, n_pairs: int, n_bootstrap: int = 1000) -> dict[str, Any]:
    """The positional part of a record: route shares on ``n_pairs`` position-only pairs (the same
    pairs at every step) and the positional verdict."""
    pairs = run.task.counterfactuals(
        n_pairs, kind="position", seed=run.train_cfg.seed + PAIRS_SEED_OFFSET
    )
    r = route_shares(
        run.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.clean.pad_mask,
        n_bootstrap=n_bootstrap,
    )
    p = positional_dominance(r)
    return to_json(
        {
            "positional": {**r.to_dict(), "top": p.top, "top_share": p.share},
            "verdicts": {
                "positional": {
                    "verdict": p.verdict,
                    "why": p.why,
                    "n_examples": r.n_examples,
                    "need": p.need,
                }
            },
        }
    )


def measure_step(
    run,
    n: int,
    n_pairs: int,
    n_bootstrap: int = 1000,
    positional: bool = True,
    n_confirm: int | None = None,
) -> dict[str, Any]:
    """One record of a loaded run (any step): ``step``, ``sha256``, ``n_examples``, ``baseline``,
    ``drops``/``ci_low``/``ci_high`` ``[n_layers][n_heads]`` (accuracy points as fractions),
    ``verdicts`` (``single_head``, ``layer0``, ``positional``: each ``{verdict, why, n_examples,
    need}``), ``positional`` (the route shares, or None) and ``confirmed``. With ``n_confirm``,
    an ablation verdict that is not a clear "no" is measured again on ``n_confirm`` examples and
    an open positional verdict on :data:`PAIRS_CONFIRM` pairs; the screen's verdicts are kept
    under ``screen``."""
    t0 = time.perf_counter()
    abl = measure_ablation(run, n, n_bootstrap)
    pos = None
    if positional and can_move_positions(run.model) and _position_changes_label(run.task):
        pos = measure_routes(run, n_pairs, n_bootstrap)
    screen = {**abl["verdicts"], **(pos["verdicts"] if pos else {})}
    confirmed = False
    if n_confirm is not None:
        if n_confirm > n and any(v["verdict"] != NO for v in abl["verdicts"].values()):
            abl, confirmed = measure_ablation(run, n_confirm, n_bootstrap), True
        if (
            pos is not None
            and n_pairs < PAIRS_CONFIRM
            and pos["verdicts"]["positional"]["verdict"] != NO
        ):
            pos, confirmed = measure_routes(run, PAIRS_CONFIRM, n_bootstrap), True
    record = {
        "step": run.provenance["step"],
        "sha256": run.provenance["sha256"],
        **abl,
        "verdicts": {**abl["verdicts"], **(pos["verdicts"] if pos else {})},
        "positional": pos["positional"] if pos else None,
        "confirmed": confirmed,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if confirmed:
        record["screen"] = screen
    return record


def _position_changes_label(task) -> bool:
    """Whether the task's position-only counterfactuals change the answer (the positional
    criterion needs an effect to share out; task 2's count does not change with position)."""
    pairs = task.counterfactuals(8, kind="position", seed=0)
    return bool((pairs.clean.labels != pairs.corrupt.labels).any())


def snapshot_dynamics(
    run_dir: str | Path,
    *,
    n: int = 128,
    n_confirm: int = 1000,
    n_pairs: int = 128,
    steps: Sequence[int] | None = None,
    positional: bool = True,
    n_bootstrap: int = 1000,
    done: SnapshotDynamics | None = None,
    on_record: Callable[[SnapshotDynamics], None] | None = None,
    progress: bool = True,
) -> SnapshotDynamics:
    """Every criterion at every snapshot (module docstring). ``done``: records already computed
    with these options, kept where their snapshot's sha256 still matches (a resumed call redoes
    nothing); ``on_record`` sees the result after each new record (to save it)."""
    manifest = {e["step"]: e for e in read_manifest(run_dir)}
    if not manifest:
        raise ValueError(f"{run_dir}: the run kept no snapshots (train it with --snapshots log)")
    wanted = sorted(manifest) if steps is None else sorted(set(steps))
    missing = [s for s in wanted if s not in manifest]
    if missing:
        raise ValueError(
            f"{run_dir}: no snapshot at step(s) {', '.join(map(str, missing[:5]))}; the run kept "
            f"{len(manifest)} (pe-interp show lists them)"
        )
    snapshots = [
        Snapshot(s, partial(load_run, run_dir, step=s), e["sha256"])
        for s, e in sorted(manifest.items())
    ]
    return walk_snapshots(
        snapshots,
        n=n,
        n_confirm=n_confirm,
        n_pairs=n_pairs,
        positional=positional,
        n_bootstrap=n_bootstrap,
        done=done,
        on_record=on_record,
        progress=progress,
        only=wanted,
    )


@dataclass(frozen=True)
class Snapshot:
    """One point of a walk: its ``step``, how to ``load`` it (a run), and its weights' ``sha256``
    when known before loading (a run's manifest), else the ``revision`` it is named by (a hub
    revision, or a directory of saved checkpoints: :mod:`pe_interp.commands.dynamics`)."""

    step: int
    load: Callable[[], Any]
    sha256: str | None = None
    revision: str | None = None


def walk_snapshots(
    snapshots: Sequence[Snapshot],
    *,
    n: int = 128,
    n_confirm: int = 1000,
    n_pairs: int = 128,
    positional: bool = True,
    n_bootstrap: int = 1000,
    done: SnapshotDynamics | None = None,
    on_record: Callable[[SnapshotDynamics], None] | None = None,
    progress: bool = True,
    only: Sequence[int] | None = None,
) -> SnapshotDynamics:
    """:func:`measure_step` at each snapshot (or at the steps ``only``), in step order: what
    :func:`snapshot_dynamics` does for a run's snapshots, for any sequence of loadable checkpoints.
    A record of ``done`` (computed with these options) is kept where its sha256 (or, unknown before
    loading, its revision) still matches; ``on_record`` sees every kept record, the result only
    those of ``only``."""
    for name, value in (("n", n), ("n_confirm", n_confirm), ("n_pairs", n_pairs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"snapshot_dynamics: {name} must be a positive whole number, got {value!r}"
            )
    options = {
        "n": n,
        "n_confirm": max(n, n_confirm),
        "n_pairs": n_pairs,
        "positional": positional,
        "n_bootstrap": n_bootstrap,
        "no_effect": NO_EFFECT,
        "pairs_confirm": PAIRS_CONFIRM,
    }
    by_step = {s.step: s for s in snapshots}

    def still(r: dict[str, Any]) -> bool:
        s = by_step.get(r["step"])
        return s is not None and (
            r["sha256"] == s.sha256 if s.sha256 is not None else r.get("revision") == s.revision
        )

    records = {
        r["step"]: r
        for r in (done.records if done is not None and done.options == options else ())
        if still(r)
    }
    todo = sorted(by_step) if only is None else sorted(set(only))
    bar = _bar(len(todo), len([s for s in todo if s in records]), progress)
    for step in todo:
        if step in records:
            continue
        snap = by_step[step]
        record = measure_step(
            snap.load(), n, n_pairs, n_bootstrap, positional, n_confirm=options["n_confirm"]
        )
        record["step"] = step
        if snap.revision is not None:
            record["revision"] = snap.revision
        records[step] = record
        if bar is not None:
            bar.update(1)
        if on_record is not None:
            on_record(SnapshotDynamics(tuple(records[s] for s in sorted(records)), options))
    if bar is not None:
        bar.close()
    return SnapshotDynamics(tuple(records[s] for s in todo), options)


def _bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc="dynamics",
        unit="snapshot",
        dynamic_ncols=True,
        leave=False,
    )

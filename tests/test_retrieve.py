"""Task 3 (retrieve: the token a fixed offset after a marker) and the longer variants of every task
(``task.extended``) that the length-generalisation probe scores.

Labels are recomputed from the tokens by a plain per-row scan (find the marker, step ``offset``
on; find the triggers and subtract; count the triggers), never from the generator's bookkeeping;
baselines against brute-force enumeration; splits and extended rows against the training rows.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from fractions import Fraction

import pytest
import torch

from pe_interp.config.presets import build_run_configs
from pe_interp.tasks import (
    Batch,
    CountTask,
    DistanceTask,
    RetrieveTask,
    make_task,
    row_hashes,
    task_from_dict,
)

RETRIEVE = {
    "retrieve": RetrieveTask(),
    "retrieve-small": RetrieveTask(
        d_vocab=20, offset=2, max_side=3, max_after=6, max_len=10, seed=3
    ),
    "retrieve-extended": RetrieveTask(
        d_vocab=40,
        offset=3,
        max_side=4,
        max_after=8,
        max_len=20,
        extra_left=5,
        extra_right=2,
        seed=1,
    ),
}
KINDS = ("position", "content", "both")


def rows(batch) -> list[list[int]]:
    return [r[:n] for r, n in zip(batch.tokens.tolist(), batch.lengths.tolist())]


def scan_target(task: RetrieveTask, row: list[int]) -> tuple[int, int]:
    """(marker position, the token ``offset`` after it), by a scan for the one marker."""
    at = [i for i, t in enumerate(row) if t == task.marker]
    assert len(at) == 1, row
    return at[0], row[at[0] + task.offset]


def scan_distance(task: DistanceTask, row: list[int]) -> tuple[int, int]:
    t1, t2 = task.triggers
    assert row.count(t1) == row.count(t2) == 1
    return row.index(t1), row.index(t2)


# ------------------------------------------------------------------------------------- task 3
@pytest.mark.parametrize("name", list(RETRIEVE))
def test_retrieve_labels_by_scan(name: str) -> None:
    task = RETRIEVE[name]
    b = task.sample(400, seed=7).validate(task.d_vocab)
    assert b.tokens.shape == (400, task.max_len)
    values = task.values.tolist()
    assert (
        task.marker not in values
        and 0 not in values
        and len(values) == task.d_vocab - 2 == task.n_classes
    )
    for row, label in zip(rows(b), b.labels.tolist()):
        at, target = scan_target(task, row)
        assert values[label] == target  # the class is the value's index among the values
        assert len(set(row)) == len(row)  # a row's values are distinct
        assert task.extra_left + 1 <= at <= task.extra_left + task.max_side
        after = len(row) - 1 - at
        assert task.offset + task.extra_right <= after <= task.max_after + task.extra_right


@pytest.mark.parametrize("name", list(RETRIEVE))
def test_retrieve_spans_by_scan(name: str) -> None:
    task = RETRIEVE[name]
    b = task.sample(200, seed=2)
    spans = task.spans(b).tolist()
    for row, span, width in zip(rows(b), spans, [task.max_len] * len(b)):
        at, _ = scan_target(task, row)
        expected = ["prefix"] * at + ["marker"] + ["gap"] * (task.offset - 1) + ["target"]
        expected += ["suffix"] * (len(row) - len(expected)) + ["padding"] * (width - len(row))
        assert [task.span_names[k] for k in span] == expected
    with pytest.raises(ValueError, match="row 0 does not hold exactly one marker"):
        task.spans(
            Batch(torch.ones_like(b.tokens[:1]), b.labels[:1], torch.ones_like(b.pad_mask[:1]))
        )


def test_retrieve_targets_cover_every_value_and_position() -> None:
    task = RETRIEVE["retrieve-small"]
    b = task.sample(20_000, seed=0)
    assert set(b.labels.tolist()) == set(range(task.n_classes))
    marks = Counter(scan_target(task, r)[0] for r in rows(b))
    assert set(marks) == set(range(1, task.max_side + 1))


def brute_force_retrieve(task: RetrieveTask) -> tuple[Counter, Fraction]:
    """Every (left, after) pair: counts per length, and E[1 / (length - 1)]."""
    lengths: Counter[int] = Counter()
    for left, after in itertools.product(
        range(1, task.max_side + 1), range(task.offset, task.max_after + 1)
    ):
        lengths[left + task.extra_left + 1 + after + task.extra_right] += 1
    total = sum(lengths.values())
    return lengths, sum(Fraction(c, total * (length - 1)) for length, c in lengths.items())


@pytest.mark.parametrize("name", list(RETRIEVE))
def test_retrieve_baselines_match_brute_force(name: str) -> None:
    task = RETRIEVE[name]
    lengths, content_only = brute_force_retrieve(task)
    counts = task.length_label_counts()
    assert counts.shape == (task.max_len + 1, task.n_classes)
    assert {i: int(counts[i, 0]) for i in range(task.max_len + 1) if counts[i, 0]} == dict(lengths)
    assert bool((counts == counts[:, :1]).all())  # every class equally likely at every length
    assert (
        task.chance_accuracy() == task.length_only_accuracy() == float(Fraction(1, task.n_classes))
    )
    assert task.content_only_accuracy() == float(content_only)


def test_retrieve_content_only_ceiling_by_monte_carlo() -> None:
    """A bag-of-tokens rule (guess a value present in the row) reaches E[1/(length-1)]."""
    task = RETRIEVE["retrieve-small"]
    b = task.sample(20_000, seed=5)
    gen = torch.Generator().manual_seed(0)
    hits = 0
    for row, label in zip(rows(b), b.labels.tolist()):
        present = [t for t in row if t != task.marker]
        hits += present[int(torch.randint(len(present), (1,), generator=gen))] == task.values[label]
    p = task.content_only_accuracy()
    assert abs(hits / len(b) - p) < 4 * (p * (1 - p) / len(b)) ** 0.5


@pytest.mark.parametrize("name", list(RETRIEVE))
def test_retrieve_splits_disjoint(name: str) -> None:
    task = RETRIEVE[name]
    train, test = task.splits(300, 100, seed=4)
    assert len(test) == 100
    assert not {tuple(r) for r in rows(train)} & {tuple(r) for r in rows(test)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(RETRIEVE))
def test_retrieve_counterfactual_families(name: str, kind: str) -> None:
    task = RETRIEVE[name]
    pairs = task.counterfactuals(200, kind=kind, seed=1)
    assert len(pairs) == 200 and torch.equal(pairs.clean.pad_mask, pairs.corrupt.pad_mask)
    values = task.values.tolist()
    for clean, corrupt, lc, lx in zip(
        rows(pairs.clean),
        rows(pairs.corrupt),
        pairs.clean.labels.tolist(),
        pairs.corrupt.labels.tolist(),
    ):
        (at, target), (new_at, new_target) = scan_target(task, clean), scan_target(task, corrupt)
        assert values[lc] == target and values[lx] == new_target and lc != lx
        assert len(set(corrupt)) == len(corrupt)
        after = len(corrupt) - 1 - new_at  # the new place is one the generator could give
        assert task.extra_left + 1 <= new_at <= task.extra_left + task.max_side
        assert task.offset + task.extra_right <= after <= task.max_after + task.extra_right
        changed = {k for k in range(len(clean)) if clean[k] != corrupt[k]}
        if kind == "position":
            assert Counter(clean) == Counter(corrupt) and changed == {at, new_at}
        else:  # every value redrawn from the values absent from the clean row
            assert not (set(clean) - {task.marker}) & (set(corrupt) - {task.marker})
            assert (new_at == at) == (kind == "content")
    again = task.counterfactuals(200, kind=kind, seed=1)
    assert torch.equal(again.corrupt.tokens, pairs.corrupt.tokens)
    legacy = task.counterfactual_pairs(50, seed=2)
    assert bool((legacy.clean.labels != legacy.corrupt.labels).all())


@pytest.mark.parametrize("name", list(RETRIEVE))
def test_retrieve_round_trips(name: str, tmp_path) -> None:
    task = RETRIEVE[name]
    assert task_from_dict(json.loads(json.dumps(task.to_dict()))) == task
    batch = task.sample(30, seed=2)
    task.to_jsonl(batch, tmp_path / "r.jsonl")
    back = task.from_jsonl(tmp_path / "r.jsonl")
    assert torch.equal(back.tokens, batch.tokens) and torch.equal(back.labels, batch.labels)
    first = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert first["target"] == scan_target(task, rows(batch)[0])[1]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"offset": 0}, "offset"),
        ({"max_after": 3}, "max_after"),
        ({"max_len": 100}, "max_len"),
        ({"d_vocab": 100}, "d_vocab"),
        ({"extra_left": -1}, "extra_left"),
        ({"max_side": 0}, "max_side"),
    ],
)
def test_retrieve_bad_configs(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"RetrieveTask\.{field} must be"):
        RetrieveTask(**kwargs)


@pytest.mark.parametrize("preset", ["smoke", "quick", "mid", "paper"])
def test_retrieve_presets(preset: str) -> None:
    model_cfg, task, _ = build_run_configs(task="retrieve", encoding="rope", preset=preset)
    assert (
        isinstance(task, RetrieveTask) and model_cfg.n_classes == task.n_classes == task.d_vocab - 2
    )
    assert model_cfg.n_ctx == task.max_len
    assert task.length_only_accuracy() == task.chance_accuracy() < 0.05
    _, authors, _ = build_run_configs(
        task="retrieve", encoding="rope", preset=preset, authors_quirks=True
    )
    assert authors == task
    assert make_task("retrieve", **{k: v for k, v in task.to_dict().items() if k != "name"}) == task


# ------------------------------------------------------------------------------------- extended tasks
EXTENDABLE = {
    "distance": DistanceTask(d_vocab=40, max_between=6, max_side=3, max_len=14, seed=2),
    "distance-authors": DistanceTask(
        d_vocab=40,
        max_between=6,
        max_side=3,
        max_len=14,
        fillers_include_triggers=True,
        distinct_fillers=True,
        seed=2,
    ),
    "retrieve": RetrieveTask(d_vocab=40, offset=2, max_side=3, max_after=6, max_len=10, seed=3),
    "count": CountTask(d_vocab=20, n_triggers=4, max_count=6, length=10, seed=1),
}


def check_extended_row(base, ext, family: str, extra: int, row: list[int], label: int) -> None:
    """The row's label, recomputed from its tokens, is the label; the decisive tokens sit where
    the family puts them."""
    left = {"shift": extra, "sides": extra // 2, "right": 0}.get(family, 0)
    if isinstance(base, DistanceTask):
        if base.fillers_include_triggers:  # ambiguous rows: the label is one of the scanned pairs
            t1, t2 = base.triggers
            pairs = {
                (i, j)
                for i, a in enumerate(row)
                for j, b in enumerate(row)
                if a == t1 and b == t2 and j > i
            }
            assert any(
                j - i == label + 2 and left + 1 <= i <= left + base.max_side for i, j in pairs
            )
            return
        i, j = scan_distance(base, row)
        assert j - i == label + 2
        assert left + 1 <= i <= left + base.max_side  # translated by exactly the family's left part
        right = len(row) - 1 - j
        assert 1 + extra - left <= right <= base.max_side + extra - left
    elif isinstance(base, RetrieveTask):
        at, target = scan_target(base, row)
        assert base.values[label] == target
        assert left + 1 <= at <= left + base.max_side
    else:
        assert len(row) == base.length + extra
        assert sum(t in set(base.triggers) for t in row) == base.class_to_count(label)


@pytest.mark.parametrize("name", list(EXTENDABLE))
def test_extended_rows_keep_their_labels(name: str) -> None:
    base = EXTENDABLE[name]
    train, _ = base.splits(400, 50, seed=0)
    for family in base.extensions:
        assert base.extended(family, 0) is base
        for extra in (1, 4, base.max_len):
            ext = base.extended(family, extra)
            assert type(ext) is type(base) and ext.max_len == base.max_len + extra
            assert (
                torch.equal(ext.label_values, base.label_values) and ext.triggers == base.triggers
            )
            b = ext.sample(300, seed=3).validate(ext.d_vocab)
            for row, label in zip(rows(b), b.labels.tolist()):
                check_extended_row(base, ext, family, extra, row, label)
            # every extended row is longer by `extra` than the base task could make it
            lengths = base.length_label_counts().sum(1).nonzero().flatten()
            assert int(b.lengths.min()) >= int(lengths.min()) + extra
            assert int(b.lengths.max()) <= int(lengths.max()) + extra
            padded = torch.zeros(len(train), ext.max_len, dtype=torch.long)
            padded[:, : base.max_len] = train.tokens
            assert not torch.isin(
                row_hashes(b.tokens), row_hashes(padded)
            ).any()  # none is a training row
            assert ext.chance_accuracy() == base.chance_accuracy()
            if family != "length":  # lengths shift by a constant: the length-only ceiling stays
                assert ext.length_only_accuracy() == base.length_only_accuracy()


def test_extended_distance_counterfactuals_stay_in_its_support() -> None:
    task = EXTENDABLE["distance"].extended("sides", 7)  # extra_left 3, extra_right 4
    for kind in KINDS:
        pairs = task.counterfactuals(100, kind=kind, seed=0)
        for row, label in zip(rows(pairs.corrupt), pairs.corrupt.labels.tolist()):
            check_extended_row(EXTENDABLE["distance"], task, "sides", 7, row, label)


def test_extended_bad_arguments() -> None:
    with pytest.raises(ValueError, match="family must be one of 'length'"):
        EXTENDABLE["count"].extended("shift", 3)
    with pytest.raises(ValueError, match="extra must be an integer"):
        EXTENDABLE["distance"].extended("shift", -1)


# ------------------------------------------------------------------------------------- every probe
def test_every_probe_runs_on_task_3(tmp_path) -> None:
    """Task 3 through the probes the other tasks get: ablation + deposit detection, patching on its
    counterfactual pairs, the logit decomposition, the circuit (attribution on the position and
    content families, faithfulness, path patching), deposit dynamics while training, gradient
    coherence, the generalisation probe, and a run report; and in the authors' mode."""
    import pe_interp
    from pe_interp.cli import main
    from probes import DepositDynamics, GeneralizationResult, gradient_coherence

    run_dir = tmp_path / "r"
    pe_interp.train(
        task="retrieve",
        preset="smoke",
        seed=1,
        out=run_dir,
        progress=False,
        callbacks=[DepositDynamics(every=8, layers=(0,), n_probe=32)],
    )
    records = [
        json.loads(line) for line in (run_dir / "deposit_dynamics.jsonl").read_text().splitlines()
    ]
    assert records and all(r["layer"] == 0 and len(r["drops"]) == 4 for r in records)
    for argv in (
        ["ablate", "--n", "64", "--n-bootstrap", "0", "--no-figures", "--no-progress"],
        ["patch", "--n", "16", "--n-bootstrap", "0"],
        ["decompose", "--layer", "0", "--head", "1", "--n", "2"],
        ["circuit", "--n", "8", "--top-n", "4"],
        ["generalize", "--n", "32", "--extras", "3", "--no-progress"],
    ):
        assert main([argv[0], str(run_dir), *argv[1:]]) == 0, argv
    ablation = json.loads((run_dir / "ablation.json").read_text())
    assert len(ablation["drops"]) == 2 and len(ablation["drops"][0]) == 4
    for name in (
        "deposits.json",
        "patching.json",
        "decompose_L0H1.json",
        "circuit.json",
        "generalization.json",
    ):
        assert (run_dir / name).is_file(), name
    gen = GeneralizationResult.load(run_dir / "generalization.json")
    assert gen.families == ["shift", "sides", "right"] and gen.trained.n == 32
    assert main(["report", str(run_dir)]) == 0 and (run_dir / "report.html").is_file()
    task = pe_interp.load_run(run_dir).task
    circ = json.loads(
        (run_dir / "circuit.json").read_text()
    )  # position-aware over task 3's own spans
    assert circ["kind"] == "circuit" and circ["span_names"] == list(task.span_names)
    assert (
        circ["spans"]
        and set(circ["spans"]) <= set(task.span_names)
        and len(circ["spans"]) == len(circ["edges"])
    )
    coherence = gradient_coherence(
        pe_interp.load_run(run_dir).model.cfg, task.sample(16, seed=0), init_seeds=[0]
    )
    assert coherence.values.shape == (1, 2, 4) and bool(torch.isfinite(coherence.values).all())
    authors = tmp_path / "authors"
    pe_interp.train(
        task="retrieve",
        preset="smoke",
        authors_quirks=True,
        seed=0,
        out=authors,
        progress=False,
        epochs=1,
    )
    run = pe_interp.load_run(authors)
    assert (
        not run.model.cfg.mask_padding
        and run.model.cfg.kv_source == "embed"
        and run.task
        == task.__class__(**{**{k: v for k, v in task.to_dict().items() if k != "name"}, "seed": 0})
    )

"""Tests for the synthetic tasks (pe_interp.tasks).

Labels are checked against a plain per-row Python scan of the tokens, never against the
generator's own bookkeeping; baselines are checked against brute-force enumeration and against
Monte-Carlo estimates from ``sample``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pe_interp.tasks import (
    PAD_ID,
    Batch,
    CounterfactualPairs,
    CountTask,
    DistanceTask,
    RetrieveTask,
    SyntheticTask,
    make_task,
    row_hashes,
    task_from_dict,
)
from pe_interp.tasks.sampling import draw_ids, random_subset

TASKS = {
    "distance": DistanceTask(),
    "distance-authors": DistanceTask(fillers_include_triggers=True),
    "distance-small": DistanceTask(d_vocab=20, max_between=6, max_side=3, max_len=11, seed=3),
    "count": CountTask(),
    "count-ignore-zero": CountTask(ignore_zero=True),
    "count-small": CountTask(d_vocab=12, n_triggers=4, max_count=8, length=10, seed=5),
    "retrieve": RetrieveTask(),
    "retrieve-small": RetrieveTask(
        d_vocab=20, offset=2, max_side=3, max_after=6, max_len=10, seed=3
    ),
}
TINY = {  # vocabularies so small that independent draws collide all the time
    "distance": DistanceTask(d_vocab=5, max_between=3, max_side=2, max_len=7),
    "count": CountTask(d_vocab=5, n_triggers=2, max_count=3, length=4),
}


@pytest.fixture(params=list(TASKS), ids=list(TASKS))
def task(request: pytest.FixtureRequest) -> SyntheticTask:
    return TASKS[request.param]


def rows_of(batch: Batch) -> list[tuple[int, ...]]:
    """Each row's real tokens, as plain Python tuples."""
    return [tuple(r[:n]) for r, n in zip(batch.tokens.tolist(), batch.lengths.tolist())]


def scan_distance(task: DistanceTask, row: tuple[int, ...]) -> set[int]:
    """All distances j - i >= 1 with row[i] == t1 and row[j] == t2 (a plain scan)."""
    t1, t2 = task.triggers
    firsts = [i for i, t in enumerate(row) if t == t1]
    seconds = [j for j, t in enumerate(row) if t == t2]
    return {j - i for i in firsts for j in seconds if j > i}


def scan_count(task: CountTask, row: tuple[int, ...]) -> int:
    triggers = set(task.triggers)
    return sum(t in triggers for t in row)


def true_value(task: SyntheticTask, label: int) -> int:
    """The task-level label of a class index, from the public mapping."""
    if isinstance(task, DistanceTask):
        return int(task.class_to_distance(label))
    if isinstance(task, RetrieveTask):
        return int(task.values[label])
    return int(task.class_to_count(label))


# ------------------------------------------------------------------------------------- Batch
def make_batch() -> Batch:
    tokens = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 0], [1, 2, 3, 4]])
    return Batch(tokens, torch.tensor([0, 1, 2]), tokens != PAD_ID)


def test_batch_indexing_and_lengths() -> None:
    b = make_batch()
    assert len(b) == 3
    assert b.lengths.tolist() == [2, 3, 4]
    assert b[1:].labels.tolist() == [1, 2]
    assert b[torch.tensor([2, 0])].tokens[:, 0].tolist() == [1, 5]
    assert b[torch.tensor([True, False, True])].labels.tolist() == [0, 2]
    assert b[[1]].lengths.tolist() == [3]
    with pytest.raises(TypeError, match="slice"):
        b[0]  # noqa: B018
    moved = b.to("cpu")
    assert torch.equal(moved.tokens, b.tokens) and torch.equal(moved.pad_mask, b.pad_mask)
    both = Batch.cat([b, b[:1]])
    assert len(both) == 4 and torch.equal(both.tokens[3], b.tokens[0])
    assert Batch.empty(7).tokens.shape == (0, 7)


def test_batch_rejects_bad_shapes_and_data() -> None:
    tokens = torch.tensor([[1, 2, 0]])
    with pytest.raises(ValueError, match="labels"):
        Batch(tokens, torch.tensor([0, 1]), tokens != 0)
    with pytest.raises(ValueError, match="tokens"):
        Batch(tokens.int(), torch.tensor([0]), tokens != 0)
    with pytest.raises(ValueError, match="pad_mask"):
        Batch(tokens, torch.tensor([0]), (tokens != 0).long())
    left_padded = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match="right-padded"):
        Batch(left_padded, torch.tensor([0]), left_padded != 0).validate()
    with pytest.raises(ValueError, match="d_vocab"):
        Batch(tokens, torch.tensor([0]), tokens != 0).validate(d_vocab=2)


def test_row_hashes_equal_rows_equal_keys() -> None:
    tokens = torch.tensor([[1, 2, 3], [1, 2, 3], [3, 2, 1], [1, 2, 0]])
    h = row_hashes(tokens)
    assert h[0] == h[1] and len(set(h.tolist())) == 3


# ------------------------------------------------------------------------------------- sampling helpers
def test_random_subset_is_exact_size_and_uniform() -> None:
    gen = torch.Generator().manual_seed(0)
    eligible = torch.tensor([[True, False, True, True, True]]).expand(12_000, 5)
    sizes = torch.full((12_000,), 2)
    taken = random_subset(eligible, sizes, gen)
    assert bool((taken.sum(1) == 2).all()) and not bool(taken[:, 1].any())
    freq = Counter(map(tuple, taken.int().tolist()))
    assert len(freq) == 6  # C(4, 2) subsets, each with probability 1/6
    se = math.sqrt((1 / 6) * (5 / 6) / 12_000)
    assert all(abs(c / 12_000 - 1 / 6) < 5 * se for c in freq.values())
    ragged = random_subset(torch.ones(3, 4, dtype=torch.bool), torch.tensor([0, 4, 1]), gen)
    assert ragged.sum(1).tolist() == [0, 4, 1]
    with pytest.raises(ValueError, match="eligible"):
        random_subset(torch.zeros(1, 3, dtype=torch.bool), torch.tensor([1]), gen)


def test_draw_ids_only_draws_given_ids() -> None:
    ids = torch.tensor([3, 8, 11])
    out = draw_ids(ids, (200, 7), torch.Generator().manual_seed(0))
    assert out.shape == (200, 7) and set(out.unique().tolist()) == {3, 8, 11}


# ------------------------------------------------------------------------------------- generation
def test_sample_is_deterministic(task: SyntheticTask) -> None:
    a, b, c = task.sample(64, seed=1), task.sample(64, seed=1), task.sample(64, seed=2)
    for name in ("tokens", "labels", "pad_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.tokens, c.tokens)
    other = dataclasses.replace(task, seed=task.seed + 1)  # type: ignore[type-var]
    assert not torch.equal(other.sample(64, seed=1).tokens, a.tokens)


def test_shapes_padding_and_vocab(task: SyntheticTask) -> None:
    b = task.sample(500, seed=0)
    assert b.tokens.shape == (500, task.max_len) and b.tokens.dtype == torch.long
    assert b.labels.dtype == torch.long and b.pad_mask.dtype == torch.bool
    assert int(b.labels.min()) >= 0 and int(b.labels.max()) < task.n_classes
    b.validate(task.d_vocab)  # right-padded; pads are PAD_ID; real tokens in 1..d_vocab-1
    assert bool((b.tokens[b.pad_mask] >= 1).all())
    if isinstance(task, CountTask):
        assert bool(b.pad_mask.all())


@pytest.mark.parametrize("name", ["distance", "distance-small"])
def test_distance_labels_by_scan(name: str) -> None:
    task = TASKS[name]
    assert isinstance(task, DistanceTask)
    t1, t2 = task.triggers
    assert t1 != t2 and PAD_ID not in task.triggers
    b = task.sample(400, seed=7)
    for row, label in zip(rows_of(b), b.labels.tolist()):
        assert row.count(t1) == 1 and row.count(t2) == 1  # fillers exclude triggers
        i, j = row.index(t1), row.index(t2)
        assert scan_distance(task, row) == {true_value(task, label)}
        assert 1 <= i <= task.max_side  # left context
        assert 2 <= j - i <= task.max_between + 1
        right = len(row) - j - 1
        low = 0 if len(row) == task.max_len else 1  # truncation can only cut right context
        assert low <= right <= task.max_side
        assert label == j - i - 2


def test_distance_with_trigger_fillers_label_is_a_real_pair() -> None:
    task = DistanceTask(
        d_vocab=8, max_between=10, max_side=4, max_len=16, fillers_include_triggers=True
    )
    b = task.sample(400, seed=0)
    rows, labels = rows_of(b), b.labels.tolist()
    assert any(r.count(task.triggers[0]) > 1 for r in rows)  # ambiguous rows do occur
    for row, label in zip(rows, labels):
        assert true_value(task, label) in scan_distance(task, row)


def test_distance_truncation_keeps_start() -> None:
    task = DistanceTask(d_vocab=30, max_between=6, max_side=3, max_len=11)
    b = task.sample(2000, seed=0)
    assert int(b.lengths.max()) == task.max_len  # some rows were longer and got truncated
    for row in rows_of(b):  # both triggers always survive
        assert row.count(task.triggers[0]) == 1 and row.count(task.triggers[1]) == 1


@pytest.mark.parametrize("name", ["count", "count-ignore-zero", "count-small"])
def test_count_labels_by_scan(name: str) -> None:
    task = TASKS[name]
    assert isinstance(task, CountTask)
    assert len(set(task.triggers)) == task.n_triggers and PAD_ID not in task.triggers
    b = task.sample(400, seed=3)
    assert bool((b.lengths == task.length).all())
    for row, label in zip(rows_of(b), b.labels.tolist()):
        assert scan_count(task, row) == true_value(task, label)
        assert task.min_count <= scan_count(task, row) <= task.max_count


def test_count_triggers_are_shuffled_uniformly_over_positions() -> None:
    task = CountTask()
    b = task.sample(4000, seed=0)
    rate = torch.isin(b.tokens, task.trigger_ids).double().mean(dim=0)
    expected = (task.max_count / 2) / task.length  # E[n] / length
    se = math.sqrt(expected * (1 - expected) / len(b))
    assert float((rate - expected).abs().max()) < 5 * se


def test_class_mappings() -> None:
    d = DistanceTask()
    assert d.n_classes == 70 and d.distances.tolist() == list(range(2, 72))
    assert d.class_to_distance(0) == 2 and d.distance_to_class(71) == 69
    assert torch.equal(d.distance_to_class(d.class_to_distance(torch.arange(70))), torch.arange(70))
    c, cz = CountTask(), CountTask(ignore_zero=True)
    assert c.n_classes == 101 and c.counts.tolist() == list(range(101))
    assert cz.n_classes == 100 and cz.counts.tolist() == list(range(1, 101))
    assert cz.class_to_count(0) == 1 and cz.count_to_class(100) == 99
    assert int(cz.sample(2000).labels.max()) < 100


# ------------------------------------------------------------------------------------- splits
@pytest.mark.parametrize("name", list(TASKS))
def test_splits_deterministic_and_disjoint(name: str) -> None:
    task = TASKS[name]
    train, test = task.splits(300, 100, seed=4)
    train2, test2 = task.splits(300, 100, seed=4)
    assert torch.equal(train.tokens, train2.tokens) and torch.equal(test.tokens, test2.tokens)
    assert len(train) == 300 and len(test) == 100
    assert not set(rows_of(train)) & set(rows_of(test))
    assert not torch.equal(train.tokens[:100], test.tokens)
    assert not torch.equal(train.tokens, task.sample(300, seed=4).tokens)  # its own stream


@pytest.mark.parametrize("name", list(TINY))
def test_splits_have_no_leakage_at_tiny_vocab(name: str) -> None:
    task = TINY[name]
    collisions = set(rows_of(task.sample(300, seed=99))) & set(rows_of(task.sample(100, seed=98)))
    assert collisions  # independent draws do collide at this size ...
    train, test = task.splits(300, 100, seed=0)
    assert len(test) == 100
    assert not set(rows_of(train)) & set(rows_of(test))  # ... but the splits never do
    test.validate(task.d_vocab)


def test_splits_warn_when_sequence_space_is_exhausted() -> None:
    task = DistanceTask(d_vocab=4, max_between=2, max_side=1, max_len=5)  # only 2 sequences exist
    with pytest.warns(UserWarning, match="too small"):
        train, test = task.splits(50, 10)
    assert len(train) == 50 and len(test) == 0


# ------------------------------------------------------------------------------------- baselines
def brute_force_distance_joint(task: DistanceTask) -> Counter[tuple[int, int]]:
    """Enumerate every (left, between, right) triple: counts per (length, class)."""
    joint: Counter[tuple[int, int]] = Counter()
    side, most = range(1, task.max_side + 1), range(1, task.max_between + 1)
    for left, between, right in itertools.product(side, most, side):
        joint[min(left + between + right + 2, task.max_len), between - 1] += 1
    return joint


@pytest.mark.parametrize(
    "task",
    [
        DistanceTask(),
        DistanceTask(d_vocab=20, max_between=6, max_side=3, max_len=11),
        DistanceTask(max_between=9, max_side=7, max_len=200),
    ],
    ids=["default", "truncating", "long-max-len"],
)
def test_distance_baselines_match_brute_force(task: DistanceTask) -> None:
    joint = brute_force_distance_joint(task)
    counts = task.length_label_counts()
    nonzero = counts.nonzero().tolist()
    assert dict(joint) == {(i, j): int(counts[i, j]) for i, j in nonzero}
    total = sum(joint.values())
    by_length: dict[int, Counter[int]] = {}
    for (length, cls), n in joint.items():
        by_length.setdefault(length, Counter())[cls] += n
    best = sum(max(c.values()) for c in by_length.values())
    assert task.length_only_accuracy() == float(Fraction(best, total))
    assert task.chance_accuracy() == float(Fraction(1, task.max_between))


def test_default_distance_baselines_match_digest() -> None:
    task = DistanceTask()  # same (left, between, right) distribution as the authors' generator
    assert abs(task.chance_accuracy() - 0.0143) < 5e-5
    assert abs(task.length_only_accuracy() - 0.0537) < 5e-5


@pytest.mark.parametrize("name", list(TASKS))
def test_baselines_agree_with_monte_carlo(name: str) -> None:
    task = TASKS[name]
    n = 20_000
    b = task.sample(n, seed=11)
    counts = task.length_label_counts().double()
    joint = counts / counts.sum()

    # The exact Bayes rule, evaluated on fresh samples, achieves the claimed accuracy.
    rule = task.length_only_predictor()
    acc = float((rule[b.lengths] == b.labels).double().mean())
    p = task.length_only_accuracy()
    assert abs(acc - p) < 4 * math.sqrt(p * (1 - p) / n)

    # Marginals of length and of class match the exact joint, bin by bin.
    for observed, expected in (
        (torch.bincount(b.lengths, minlength=task.max_len + 1).double() / n, joint.sum(1)),
        (torch.bincount(b.labels, minlength=task.n_classes).double() / n, joint.sum(0)),
    ):
        se = (expected * (1 - expected) / n).sqrt()
        assert bool(((observed - expected).abs() <= 5 * se + 1e-12).all())
    assert task.chance_accuracy() == pytest.approx(float(joint.sum(0).max()), abs=1e-12)


def test_count_baselines() -> None:
    assert CountTask().chance_accuracy() == pytest.approx(1 / 101)
    assert CountTask(ignore_zero=True).chance_accuracy() == pytest.approx(1 / 100)
    for task in (CountTask(), CountTask(ignore_zero=True)):  # fixed length: length says nothing
        assert task.length_only_accuracy() == task.chance_accuracy()


# ------------------------------------------------------------------------------------- counterfactuals
def check_pairs_common(task: SyntheticTask, pairs: CounterfactualPairs, n: int) -> None:
    assert len(pairs) == n
    assert torch.equal(pairs.clean.pad_mask, pairs.corrupt.pad_mask)
    assert bool((pairs.clean.labels != pairs.corrupt.labels).all())
    for batch in (pairs.clean, pairs.corrupt):
        batch.validate(task.d_vocab)
        assert int(batch.labels.max()) < task.n_classes


@pytest.mark.parametrize("name", ["distance", "distance-small", "distance-authors"])
def test_distance_counterfactual_moves_second_trigger(name: str) -> None:
    task = TASKS[name]
    assert isinstance(task, DistanceTask)
    pairs = task.counterfactual_pairs(300, seed=1)
    check_pairs_common(task, pairs, 300)
    t1, t2 = task.triggers
    assert bool((pairs.changed.sum(dim=1) == 2).all())
    for clean, corrupt, lc, lx in zip(
        rows_of(pairs.clean),
        rows_of(pairs.corrupt),
        pairs.clean.labels.tolist(),
        pairs.corrupt.labels.tolist(),
    ):
        p, q = (k for k in range(len(clean)) if clean[k] != corrupt[k])
        assert t2 in (clean[p], clean[q]) and t2 in (corrupt[p], corrupt[q])  # t2 moved ...
        assert (clean[p], clean[q]) == (corrupt[q], corrupt[p])  # ... by a swap: fillers stay
        assert t1 not in (clean[p], clean[q])  # t1 untouched
        assert true_value(task, lx) in scan_distance(task, corrupt)
        if not task.fillers_include_triggers:
            assert scan_distance(task, clean) == {true_value(task, lc)}
            assert scan_distance(task, corrupt) == {true_value(task, lx)}
    again = task.counterfactual_pairs(300, seed=1)
    assert torch.equal(again.corrupt.tokens, pairs.corrupt.tokens)


@pytest.mark.parametrize("name", ["count", "count-ignore-zero", "count-small"])
def test_count_counterfactual_replaces_triggers(name: str) -> None:
    task = TASKS[name]
    assert isinstance(task, CountTask)
    pairs = task.counterfactual_pairs(300, seed=1)
    check_pairs_common(task, pairs, 300)
    triggers = set(task.triggers)
    for clean, corrupt, lc, lx in zip(
        rows_of(pairs.clean),
        rows_of(pairs.corrupt),
        pairs.clean.labels.tolist(),
        pairs.corrupt.labels.tolist(),
    ):
        changed = [k for k in range(len(clean)) if clean[k] != corrupt[k]]
        assert changed and all(clean[k] in triggers and corrupt[k] not in triggers for k in changed)
        assert scan_count(task, clean) == true_value(task, lc)
        assert (
            scan_count(task, corrupt)
            == true_value(task, lx)
            == scan_count(task, clean) - len(changed)
        )
        assert scan_count(task, corrupt) >= task.min_count


# ------------------------------------------------------------------------------------- JSONL
@pytest.mark.parametrize("name", list(TASKS))
def test_jsonl_round_trip(name: str, tmp_path) -> None:
    task = TASKS[name]
    batch = task.sample(50, seed=2)
    path = tmp_path / "data.jsonl"
    task.to_jsonl(batch, path)
    back = task.from_jsonl(path)
    for field in ("tokens", "labels", "pad_mask"):
        assert torch.equal(getattr(back, field), getattr(batch, field))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    key = task.jsonl_label_key  # the authors' "distance" (tasks 1 and 2); "target" for task 3
    assert len(lines) == 50 and set(lines[0]) == {"text", key}
    for obj, row, label in zip(lines, rows_of(batch), batch.labels.tolist()):
        assert obj["text"] == " ".join(f"w{t}" for t in row)
        assert obj[key] == true_value(task, label)


def test_jsonl_reads_count_key_and_empty_file(tmp_path) -> None:
    task = CountTask(d_vocab=12, n_triggers=4, max_count=3, length=3)
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "w1 w2 w3", "count": 2}\n\n')
    assert task.from_jsonl(path).labels.tolist() == [2]
    path.write_text("")
    assert len(task.from_jsonl(path)) == 0


BAD_LINES = {
    "not json": "invalid JSON",
    "[1, 2]": "object",
    '{"text": "w1 w2 w3"}': "missing",
    '{"text": "w1 x2 w3", "distance": 2}': "w<id>",
    '{"text": "w1 w0 w3", "distance": 2}': "outside",
    '{"text": "w1 w99 w3", "distance": 2}': "outside",
    '{"text": "w1 w2 w3", "distance": 1}': "not a label value",
    '{"text": "w1 w2 w3", "distance": true}': "not a label value",
    '{"text": "w1 w2 w3", "distance": "2"}': "not a label value",
    '{"text": "", "distance": 2}': "words",
    '{"text": "' + " ".join(["w1"] * 12) + '", "distance": 2}': "words",
}


@pytest.mark.parametrize("bad,why", list(BAD_LINES.items()), ids=list(range(len(BAD_LINES))))
def test_jsonl_malformed_line_names_file_and_line(bad: str, why: str, tmp_path) -> None:
    task = DistanceTask(d_vocab=20, max_between=6, max_side=3, max_len=11)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "w1 w2 w3", "distance": 2}\n\n' + bad + "\n")
    with pytest.raises(ValueError, match=why) as err:
        task.from_jsonl(path)
    assert f"{path}:3:" in str(err.value)


# ------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name", list(TASKS))
def test_to_dict_round_trip(name: str) -> None:
    task = TASKS[name]
    d = json.loads(json.dumps(task.to_dict()))
    back = task_from_dict(d)
    assert back == task and type(back) is type(task)
    assert back.triggers == task.triggers  # type: ignore[attr-defined]
    assert torch.equal(back.sample(8, seed=1).tokens, task.sample(8, seed=1).tokens)


def test_make_task() -> None:
    assert make_task("distance", max_between=5, max_len=40) == DistanceTask(
        max_between=5, max_len=40
    )
    assert make_task("count").name == "count" and make_task("distance").name == "distance"
    assert make_task("retrieve").name == "retrieve"
    with pytest.raises(ValueError, match="unknown task"):
        make_task("reverse")
    with pytest.raises(ValueError, match="bad arguments"):
        make_task("count", max_between=3)
    with pytest.raises(ValueError, match="name"):
        task_from_dict({"d_vocab": 10})


@pytest.mark.parametrize(
    "cls,kwargs,field",
    [
        (DistanceTask, {"d_vocab": 3}, "d_vocab"),
        (DistanceTask, {"d_vocab": 3, "fillers_include_triggers": True}, "d_vocab"),
        (DistanceTask, {"max_between": 1}, "max_between"),
        (DistanceTask, {"max_side": 0}, "max_side"),
        (DistanceTask, {"max_len": 96}, "max_len"),
        (DistanceTask, {"seed": -1}, "seed"),
        (DistanceTask, {"d_vocab": 12.0}, "d_vocab"),
        (DistanceTask, {"fillers_include_triggers": 1}, "fillers_include_triggers"),
        (CountTask, {"d_vocab": 31}, "d_vocab"),
        (CountTask, {"n_triggers": 0}, "n_triggers"),
        (CountTask, {"max_count": 121}, "max_count"),
        (CountTask, {"max_count": 0}, "max_count"),
        (CountTask, {"max_count": 1, "ignore_zero": True}, "max_count"),
        (CountTask, {"length": 0}, "length"),
        (CountTask, {"seed": True}, "seed"),
    ],
)
def test_bad_configs_raise(cls: type, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field} must be") as err:
        cls(**kwargs)
    assert "got" in str(err.value)


def test_bad_call_arguments_raise() -> None:
    with pytest.raises(ValueError, match="sample.n"):
        DistanceTask().sample(-1)
    with pytest.raises(ValueError, match="splits.seed"):
        CountTask().splits(10, 10, seed=-2)
    assert len(DistanceTask().sample(0)) == 0


small = st.integers(min_value=-3, max_value=40)


@settings(max_examples=100, deadline=None)
@given(
    d_vocab=small,
    max_between=small,
    max_side=small,
    slack=st.integers(-3, 8),
    include=st.booleans(),
)
def test_distance_config_validation_property(
    d_vocab, max_between, max_side, slack, include
) -> None:
    max_len = max_side + max_between + 2 + slack  # near the boundary, to hit both sides of it
    valid = d_vocab >= 4 and max_between >= 2 and max_side >= 1 and slack >= 0
    kwargs = dict(
        d_vocab=d_vocab,
        max_between=max_between,
        max_side=max_side,
        max_len=max_len,
        fillers_include_triggers=include,
    )
    event("valid" if valid else "invalid")
    if not valid:
        with pytest.raises(ValueError, match="DistanceTask"):
            DistanceTask(**kwargs)
        return
    task = DistanceTask(**kwargs)
    b = task.sample(16, seed=0).validate(task.d_vocab)
    assert b.tokens.shape == (16, max_len) and int(b.labels.max()) < task.n_classes
    pairs = task.counterfactual_pairs(4)
    assert bool((pairs.clean.labels != pairs.corrupt.labels).all())


@settings(max_examples=100, deadline=None)
@given(
    spare=st.integers(-3, 20),
    n_triggers=small,
    max_count=small,
    length=small,
    ignore_zero=st.booleans(),
)
def test_count_config_validation_property(
    spare, n_triggers, max_count, length, ignore_zero
) -> None:
    d_vocab = n_triggers + 2 + spare  # near the boundary, to hit both sides of it
    valid = (
        n_triggers >= 1
        and spare >= 0
        and length >= 1
        and (2 if ignore_zero else 1) <= max_count <= length
    )
    kwargs = dict(
        d_vocab=d_vocab,
        n_triggers=n_triggers,
        max_count=max_count,
        length=length,
        ignore_zero=ignore_zero,
    )
    event("valid" if valid else "invalid")
    if not valid:
        with pytest.raises(ValueError, match="CountTask"):
            CountTask(**kwargs)
        return
    task = CountTask(**kwargs)
    b = task.sample(16, seed=0).validate(task.d_vocab)
    assert b.tokens.shape == (16, length)
    for row, label in zip(rows_of(b), b.labels.tolist()):
        assert scan_count(task, row) == true_value(task, label)
    pairs = task.counterfactual_pairs(4)
    assert bool((pairs.clean.labels != pairs.corrupt.labels).all())

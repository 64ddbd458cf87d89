"""``task.counterfactuals(n, kind, seed)``: the position, content and both families of each task,
checked row by row with plain Python scans of the tokens (never the generator's bookkeeping)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pe_interp.tasks import CounterfactualPairs, CountTask, DistanceTask, SyntheticTask

KINDS = ("position", "content", "both")
DISTANCE = {
    "distance": DistanceTask(),
    "distance-authors": DistanceTask(fillers_include_triggers=True),
    "distance-small": DistanceTask(d_vocab=20, max_between=6, max_side=3, max_len=11, seed=3),
    "distance-distinct": DistanceTask(
        d_vocab=24, max_between=6, max_side=3, max_len=14, distinct_fillers=True
    ),
    "distance-tiny": DistanceTask(d_vocab=6, max_between=3, max_side=2, max_len=7),
    # lengthened for the generalisation probe: 4 more fillers before t1, 2 more after t2
    "distance-extended": DistanceTask(
        d_vocab=30,
        max_between=6,
        max_side=3,
        max_len=20,
        distinct_fillers=True,
        extra_left=4,
        extra_right=2,
    ),
}
COUNT = {
    "count": CountTask(),
    "count-ignore-zero": CountTask(ignore_zero=True),
    "count-small": CountTask(d_vocab=12, n_triggers=4, max_count=8, length=10, seed=5),
    "count-full": CountTask(
        d_vocab=8, n_triggers=2, max_count=6, length=6
    ),  # count 6 fills the row
}
N = 200


def rows(batch) -> list[list[int]]:
    return [r[:n] for r, n in zip(batch.tokens.tolist(), batch.lengths.tolist())]


def check_common(task: SyntheticTask, pairs: CounterfactualPairs, n: int) -> None:
    assert isinstance(pairs, CounterfactualPairs) and len(pairs) == n
    for batch in (pairs.clean, pairs.corrupt):
        batch.validate(task.d_vocab)
        assert batch.tokens.shape == (n, task.max_len)
        assert int(batch.labels.max()) < task.n_classes
    assert torch.equal(pairs.clean.pad_mask, pairs.corrupt.pad_mask)


def trigger_slots(task: DistanceTask, row: list[int], label: int) -> tuple[int, int]:
    """Where t1 and t2 are: the only occurrences, or (fillers may be trigger-valued) the pair at
    the labelled distance."""
    t1, t2 = task.triggers
    pairs = [
        (i, j)
        for i, a in enumerate(row)
        for j, b in enumerate(row)
        if a == t1 and b == t2 and j > i
    ]
    if not task.fillers_include_triggers:
        assert len(pairs) == 1 and row.count(t1) == row.count(t2) == 1
        assert pairs[0][1] - pairs[0][0] == label + 2  # the label is the scanned distance
    at = [p for p in pairs if p[1] - p[0] == label + 2]
    assert at, (row, label)
    return at[0]


def in_generator_support(task: DistanceTask, row: list[int], first: int, second: int) -> bool:
    right = len(row) - 1 - second
    lowest = 0 if len(row) == task.max_len else 1 + task.extra_right
    return (
        task.extra_left + 1 <= first <= task.extra_left + task.max_side
        and 2 <= second - first <= task.max_between + 1
        and lowest <= right <= task.max_side + task.extra_right
    )


def fillers(row: list[int], slots: tuple[int, int]) -> list[int]:
    return [t for k, t in enumerate(row) if k not in slots]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(DISTANCE))
def test_distance_families(name: str, kind: str) -> None:
    task = DISTANCE[name]
    pairs = task.counterfactuals(N, kind=kind, seed=1)
    check_common(task, pairs, N)
    for clean, corrupt, lc, lx in zip(
        rows(pairs.clean),
        rows(pairs.corrupt),
        pairs.clean.labels.tolist(),
        pairs.corrupt.labels.tolist(),
    ):
        assert len(clean) == len(corrupt)
        old, new = trigger_slots(task, clean, lc), trigger_slots(task, corrupt, lx)
        assert in_generator_support(task, clean, *old) and in_generator_support(task, corrupt, *new)
        changed = {k for k in range(len(clean)) if clean[k] != corrupt[k]}
        if kind == "position":
            assert lx != lc and Counter(clean) == Counter(corrupt)  # the same tokens, moved
            assert changed <= set(old) | set(new) and len(changed) >= 2
        else:
            clean_ids, corrupt_ids = set(fillers(clean, old)), set(fillers(corrupt, new))
            assert not clean_ids & corrupt_ids  # the rows share no filler id
            assert not set(task.triggers) & corrupt_ids and corrupt_ids <= set(
                task.filler_ids.tolist()
            )
            assert changed >= set(range(len(clean))) - set(new) - set(old)
            if kind == "content":
                assert lx == lc and new == old
            else:
                assert lx != lc
        if task.distinct_fillers:  # the generator's rule: no repeat within a segment
            a, b = new
            for segment in (corrupt[:a], corrupt[a + 1 : b], corrupt[b + 1 :]):
                assert len(set(segment)) == len(segment)


def scan_count(task: CountTask, row: list[int]) -> int:
    return sum(t in set(task.triggers) for t in row)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(COUNT))
def test_count_families(name: str, kind: str) -> None:
    task = COUNT[name]
    pairs = task.counterfactuals(N, kind=kind, seed=1)
    check_common(task, pairs, N)
    triggers = set(task.triggers)
    for clean, corrupt, lc, lx in zip(
        rows(pairs.clean),
        rows(pairs.corrupt),
        pairs.clean.labels.tolist(),
        pairs.corrupt.labels.tolist(),
    ):
        assert len(clean) == len(corrupt) == task.length
        c, c_new = scan_count(task, clean), scan_count(task, corrupt)
        assert c == task.class_to_count(lc) and c_new == task.class_to_count(lx)
        slots, new_slots = ({k for k, t in enumerate(r) if t in triggers} for r in (clean, corrupt))
        if kind == "position":
            assert (
                Counter(clean) == Counter(corrupt) and lx == lc
            )  # the same tokens, the same count
            assert slots != new_slots  # ... with the triggers elsewhere
        else:
            assert c_new != c
        if kind == "content":
            changed = [k for k in range(len(clean)) if clean[k] != corrupt[k]]
            assert len(changed) == abs(c_new - c)  # only the tokens that change role change
            grew = c_new > c
            assert all(
                (clean[k] in triggers) != grew and (corrupt[k] in triggers) == grew for k in changed
            )


@pytest.mark.parametrize("task", [*DISTANCE.values(), *COUNT.values()], ids=[*DISTANCE, *COUNT])
def test_families_are_seeded_pure_functions(task: SyntheticTask) -> None:
    for kind in KINDS:
        a = task.counterfactuals(50, kind=kind, seed=4)
        b = task.counterfactuals(50, kind=kind, seed=4)
        for x, y in ((a.clean, b.clean), (a.corrupt, b.corrupt)):
            assert torch.equal(x.tokens, y.tokens) and torch.equal(x.labels, y.labels)
        assert not torch.equal(
            task.counterfactuals(50, kind=kind, seed=5).clean.tokens, a.clean.tokens
        )
    streams = [task.counterfactuals(50, kind=kind, seed=4).clean.tokens for kind in KINDS]
    assert not torch.equal(streams[0], streams[1]) and not torch.equal(streams[1], streams[2])
    assert not torch.equal(task.counterfactual_pairs(50, seed=4).clean.tokens, streams[0])
    assert len(task.counterfactuals(0, kind="both")) == 0


def test_labels_vary_and_every_new_placement_occurs() -> None:
    """Not a constant construction: for one clean length, the position family reaches every
    placement the generator allows at another distance."""
    task = DISTANCE["distance-small"]
    pairs = task.counterfactuals(4000, kind="position", seed=0)
    seen: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for clean, corrupt, lc, lx in zip(
        rows(pairs.clean),
        rows(pairs.corrupt),
        pairs.clean.labels.tolist(),
        pairs.corrupt.labels.tolist(),
    ):
        seen.setdefault((len(clean), lc), set()).add(trigger_slots(task, corrupt, lx))
    length, label = 8, 2  # distance 4 in 8 tokens: left + right = 3
    allowed = {
        (a, a + d)
        for a in range(1, 4)
        for d in range(2, 8)
        if d != label + 2 and 1 <= length - 1 - (a + d) <= 3
    }
    assert seen[length, label] == allowed


def test_bad_arguments_and_impossible_families() -> None:
    task = DISTANCE["distance"]
    with pytest.raises(ValueError, match="kind must be one of 'position', 'content', 'both'"):
        task.counterfactuals(3, kind="order")
    with pytest.raises(ValueError, match="counterfactuals.n"):
        task.counterfactuals(-1)
    # max_side=1 and rows never reach max_len: the length fixes the distance.
    with pytest.raises(RuntimeError, match="no other placement"):
        DistanceTask(max_side=1, max_between=3, max_len=10).counterfactuals(5, kind="position")
    DistanceTask(max_side=1, max_between=3, max_len=10).counterfactuals(5, kind="content")
    with pytest.raises(ValueError, match="no 'position' counterfactual"):
        CountTask(d_vocab=4, n_triggers=1, max_count=1, length=1).counterfactuals(
            2, kind="position"
        )

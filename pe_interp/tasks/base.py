"""What every synthetic task shares: seeded streams, splits, baselines, serialisation.

A concrete task is a frozen dataclass that subclasses :class:`SyntheticTask` and supplies the
generator (``_generate``), the counterfactual constructions (``_counterfactual``,
``_counterfactual_family``), the class → label-value table (``label_values``) and the exact joint
distribution of (sequence length, class) (``length_label_counts``). Everything else is defined here
once.

Randomness: every public method draws from its own ``torch.Generator`` seeded from
``(task name, task seed, stream, seed, ...)`` through a hash, so ``sample``, the train split, the
test split and counterfactual pairs are pure functions of their arguments and never share a
stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from abc import ABC, abstractmethod
from fractions import Fraction
from os import PathLike
from typing import Any, ClassVar

import torch
from jaxtyping import Int
from torch import Tensor

from pe_interp.tasks.batch import Batch, CounterfactualPairs, row_hashes

_MAX_REFILL_ROUNDS = 32
COUNTERFACTUAL_KINDS = ("position", "content", "both")
# How a task can be made longer for length generalisation (:meth:`SyntheticTask.extended`):
# "shift" adds fillers before everything (the positions that matter move right), "right" after
# everything (they stay), "sides" half before and half after; "length" makes a fixed-length,
# shuffled sequence longer.
EXTENSION_FAMILIES = ("shift", "sides", "right", "length")


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts (stable across processes and platforms)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def check_int(
    owner: str, name: str, value: Any, low: int, high: int | None = None, why: str = ""
) -> None:
    """Raise ValueError naming ``owner.name`` and the allowed range unless ``value`` is in it."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    ok = ok and (high is None or value <= high)
    if not ok:
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        suffix = f" ({why})" if why else ""
        raise ValueError(f"{owner}.{name} must be an integer {allowed}{suffix}, got {value!r}")


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def _ratio(numerator: int, denominator: int) -> float:
    return float(Fraction(numerator, denominator))


class SyntheticTask(ABC):
    """Base class of the synthetic classification tasks (see the module docstring)."""

    name: ClassVar[str]
    jsonl_label_key: ClassVar[str] = "distance"  # the key the authors' data files use
    # The ways :meth:`extended` can lengthen this task's inputs (a subset of EXTENSION_FAMILIES).
    extensions: ClassVar[tuple[str, ...]] = ()
    # Provided by the concrete dataclasses:
    d_vocab: int
    seed: int

    # ----------------------------------------------------------------- what a task supplies
    @property
    @abstractmethod
    def max_len(self) -> int:
        """The padded length of ``tokens``."""

    @property
    @abstractmethod
    def label_values(self) -> Int[Tensor, " n_classes"]:
        """The task-level label value (distance, count) of each class index."""

    @abstractmethod
    def length_label_counts(self) -> Int[Tensor, "len n_classes"]:
        """Exact joint distribution of (number of real tokens, class), as integer counts.

        Shape ``[max_len + 1, n_classes]``; dividing by the total gives probabilities. Computed
        analytically from the generator's definition, not by sampling.
        """

    @abstractmethod
    def _generate(self, n: int, gen: torch.Generator) -> Batch:
        """``n`` i.i.d. samples, vectorised over the batch."""

    @abstractmethod
    def _counterfactual(self, n: int, gen: torch.Generator) -> CounterfactualPairs:
        """``n`` clean/corrupt pairs, vectorised over the batch."""

    @abstractmethod
    def _counterfactual_family(
        self, n: int, kind: str, gen: torch.Generator
    ) -> CounterfactualPairs:
        """``n`` pairs of one family of :meth:`counterfactuals` (``kind`` already checked),
        vectorised over the batch."""

    # ----------------------------------------------------------------- the examples' structure
    span_names: ClassVar[tuple[str, ...]] = ()

    def spans(self, batch: Batch) -> Int[Tensor, "batch pos"]:
        """Each position's span (an index into :attr:`span_names`): the parts every example of
        the task is built from, as its generator lays them out (a position-aware circuit keeps an
        edge at some spans and not at others)."""
        raise ValueError(f"{type(self).__name__} defines no spans")

    # ----------------------------------------------------------------- derived properties
    @property
    def n_classes(self) -> int:
        return int(self.label_values.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description; :func:`pe_interp.tasks.task_from_dict` inverts it."""
        return {"name": self.name, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    # ----------------------------------------------------------------- sampling
    def generator(self, stream: str, *parts: object) -> torch.Generator:
        """A CPU generator for one named stream, seeded from the task seed and ``parts``."""
        return torch.Generator().manual_seed(derive_seed(self.name, self.seed, stream, *parts))

    def sample(self, n: int, seed: int = 0) -> Batch:
        """``n`` samples drawn i.i.d. from the task; a pure function of (task, n, seed)."""
        _check_call("sample", n=n, seed=seed)
        return self._generate(n, self.generator("sample", seed))

    def splits(self, n_train: int, n_test: int, seed: int = 0) -> tuple[Batch, Batch]:
        """Train and test sets from disjoint streams, with no test sequence also in train.

        Test rows whose sequence occurs in train are dropped and replaced by fresh rows from a
        third stream (also checked against train), deterministically. Only when the task's
        sequence space is nearly exhausted by ``train`` can the test set end up smaller than
        ``n_test``; that emits a warning. Conditioning on "not in train" slightly reweights the
        test distribution when the space is small; at realistic vocabularies nothing collides.
        """
        _check_call("splits", n_train=n_train, n_test=n_test, seed=seed)
        train = self._generate(n_train, self.generator("train", seed))
        if getattr(self, "dedup", False):
            train = self._without_duplicates(train, seed)
        train_keys = row_hashes(train.tokens)
        test = self._generate(n_test, self.generator("test", seed))
        test = test[~torch.isin(row_hashes(test.tokens), train_keys)]
        refill_round = 0
        while len(test) < n_test and refill_round < _MAX_REFILL_ROUNDS:
            need = n_test - len(test)
            extra = self._generate(
                max(2 * need, 64), self.generator("test-refill", seed, refill_round)
            )
            extra = extra[~torch.isin(row_hashes(extra.tokens), train_keys)][:need]
            test = Batch.cat([test, extra])
            refill_round += 1
        if len(test) < n_test:
            warnings.warn(
                f"{type(self).__name__}.splits: only {len(test)} of {n_test} test rows are not in "
                f"train; the task's sequence space is too small for disjoint splits of this size",
                stacklevel=2,
            )
        return train, test

    def _without_duplicates(self, train: Batch, seed: int) -> Batch:
        """``train`` with exact duplicate rows removed (first occurrences kept), refilled from a
        stream of its own to its size (the authors' dedup of the generated set, §3)."""
        n_train = len(train)
        keep = first_occurrences(row_hashes(train.tokens))
        refill_round = 0
        while not bool(keep.all()) and refill_round < _MAX_REFILL_ROUNDS:
            train = train[keep]
            need = n_train - len(train)
            extra = self._generate(
                max(2 * need, 64), self.generator("train-refill", seed, refill_round)
            )
            extra = extra[~torch.isin(row_hashes(extra.tokens), row_hashes(train.tokens))]
            train = Batch.cat([train, extra[first_occurrences(row_hashes(extra.tokens))][:need]])
            keep = first_occurrences(row_hashes(train.tokens))
            refill_round += 1
        if len(train) < n_train or not bool(keep.all()):
            raise ValueError(
                f"{type(self).__name__}.splits: cannot draw {n_train} distinct training rows; "
                "the task's sequence space is too small"
            )
        return train

    def counterfactual_pairs(self, n: int, seed: int = 0) -> CounterfactualPairs:
        """``n`` clean/corrupt pairs for activation patching (see the task's docstring)."""
        _check_call("counterfactual_pairs", n=n, seed=seed)
        return self._counterfactual(n, self.generator("pairs", seed))

    def counterfactuals(self, n: int, kind: str = "position", seed: int = 0) -> CounterfactualPairs:
        """``n`` clean/corrupt pairs of one counterfactual family, with their labels.

        A pure function of (task, ``n``, ``kind``, ``seed``), from a stream of its own. In every
        family a corrupt row has its clean row's length and ``pad_mask``, so positions line up;
        ``clean.labels`` and ``corrupt.labels`` are each row's true class.

        - ``kind="position"``: the same tokens, with the triggers moved.
        - ``kind="content"``: the same positions, with token identities changed.
        - ``kind="both"``: both changes at once.

        Exactly, per task (the task's ``_counterfactual_family`` has the details):

        - :class:`~pe_interp.tasks.DistanceTask`. ``position``: the same multiset of tokens, ``t1``
          and ``t2`` swapped into a new placement at another distance (uniform over the placements
          the generator could produce at that length), at most four positions changed; the
          label changes. ``content``: the same trigger positions and label, every filler redrawn
          from the filler ids absent from the clean row. ``both``: the new placement with fillers
          absent from the clean row; the label changes.
        - :class:`~pe_interp.tasks.CountTask`. ``position``: the same tokens permuted so that the
          set of trigger positions changes; the count and label stay. ``content``: the same
          positions, a uniform subset of triggers turned into fillers or of fillers into
          triggers so that the count becomes another uniform count; the label changes, every
          other token stays. ``both``: that content change, then a uniform permutation.

        :meth:`counterfactual_pairs` is a separate, unchanged construction.
        """
        _check_call("counterfactuals", n=n, seed=seed)
        if kind not in COUNTERFACTUAL_KINDS:
            raise ValueError(
                f"counterfactuals: kind must be one of {', '.join(map(repr, COUNTERFACTUAL_KINDS))}; got {kind!r}"
            )
        return self._counterfactual_family(n, kind, self.generator("counterfactuals", kind, seed))

    # ----------------------------------------------------------------- longer inputs
    def extended(self, family: str, extra: int) -> SyntheticTask:
        """The same task on inputs ``extra`` tokens longer: the same classes, label values and
        special tokens (triggers, marker), so a model trained on ``self`` can be scored on it.

        ``family`` is one of :attr:`extensions`: ``"shift"`` puts ``extra`` more fillers before
        everything, so the tokens that decide the label sit ``extra`` positions further right
        (translation); ``"right"`` puts them after everything (the same positions, longer
        inputs); ``"sides"`` puts ``extra // 2`` before and the rest after; ``"length"`` (a task
        whose tokens are shuffled over a fixed length) makes every sequence ``extra`` tokens
        longer with the same label distribution. Every row of the extended task is exactly
        ``extra`` tokens longer than the row the generator would otherwise draw, and
        ``max_len`` grows by ``extra``. ``extended(f, 0)`` is ``self``.
        """
        if family not in self.extensions:
            raise ValueError(
                f"{type(self).__name__}.extended: family must be one of "
                f"{', '.join(map(repr, self.extensions)) or '(none)'}; got {family!r}"
            )
        check_int(f"{type(self).__name__}.extended", "extra", extra, 0)
        return self if extra == 0 else self._extended(family, extra)

    def _extended(self, family: str, extra: int) -> SyntheticTask:
        raise NotImplementedError(f"{type(self).__name__} has no extensions")

    # ----------------------------------------------------------------- exact baselines
    def chance_accuracy(self) -> float:
        """Accuracy of the best constant prediction (the most frequent class)."""
        counts = self.length_label_counts()
        return _ratio(int(counts.sum(0).max()), int(counts.sum()))

    def length_only_predictor(self) -> Int[Tensor, " len"]:
        """Bayes-optimal class for each sequence length (index = number of real tokens)."""
        return self.length_label_counts().argmax(dim=1)

    def length_only_accuracy(self) -> float:
        """Bayes-optimal accuracy from the sequence length alone.

        This is the ceiling for a model that sees only the number of pad tokens (e.g. an
        unmasked, permutation-invariant model; paper digest §9.3).
        """
        counts = self.length_label_counts()
        return _ratio(int(counts.max(dim=1).values.sum()), int(counts.sum()))

    # ----------------------------------------------------------------- authors' JSONL format
    def to_jsonl(self, batch: Batch, path: str | PathLike[str]) -> None:
        """Write one ``{"text": "w12 w7 ...", "<label key>": value}`` line per row."""
        from pe_interp.tasks.jsonl import write_jsonl

        write_jsonl(self, batch, path)

    def from_jsonl(self, path: str | PathLike[str]) -> Batch:
        """Read a file written by :meth:`to_jsonl`; a malformed line raises ValueError."""
        from pe_interp.tasks.jsonl import read_jsonl

        return read_jsonl(self, path)

    # ----------------------------------------------------------------- shared helpers
    def _label_to_class(self) -> dict[int, int]:
        return {int(v): c for c, v in enumerate(self.label_values.tolist())}


def extend_sides(task: Any, family: str, extra: int) -> Any:
    """:meth:`SyntheticTask.extended` for a task with ``extra_left``, ``extra_right`` and
    ``max_len`` fields (fillers before and after its segments)."""
    left = {"shift": extra, "sides": extra // 2, "right": 0}[family]
    return dataclasses.replace(
        task,
        extra_left=task.extra_left + left,
        extra_right=task.extra_right + extra - left,
        max_len=task.max_len + extra,
    )


def first_occurrences(keys: Int[Tensor, " n"]) -> Tensor:
    """True at the first occurrence of each key, False at later repeats."""
    order = torch.argsort(keys, stable=True)
    sorted_keys = keys[order]
    first_sorted = torch.ones_like(sorted_keys, dtype=torch.bool)
    first_sorted[1:] = sorted_keys[1:] != sorted_keys[:-1]
    out = torch.empty_like(first_sorted)
    out[order] = first_sorted
    return out


def _check_call(method: str, **values: Any) -> None:
    for name, value in values.items():
        check_int(method, name, value, 0)

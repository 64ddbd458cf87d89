"""The paper's two synthetic classification tasks (paper digest §3), and a third that needs position
and content together.

- :class:`DistanceTask` (Task 1, position-sensitive): the distance between two fixed triggers.
- :class:`CountTask` (Task 2, position-agnostic): how many of a fixed set of triggers occur.
- :class:`RetrieveTask` (Task 3, beyond the paper): the token a fixed offset after a marker.

All produce :class:`Batch` objects of right-padded token ids (``PAD_ID = 0``), vectorised and
seeded; all give disjoint train/test splits, exact chance and length-only baselines,
counterfactual pairs for activation patching, longer variants for length generalisation
(``extended``), and the authors' JSONL format.
"""

from __future__ import annotations

from typing import Any

from pe_interp.tasks.base import SyntheticTask, derive_seed
from pe_interp.tasks.batch import PAD_ID, Batch, CounterfactualPairs, row_hashes
from pe_interp.tasks.count import CountTask
from pe_interp.tasks.distance import DistanceTask
from pe_interp.tasks.retrieve import RetrieveTask

TASKS: dict[str, type[SyntheticTask]] = {
    "distance": DistanceTask,
    "count": CountTask,
    "retrieve": RetrieveTask,
}


def make_task(name: str, **kwargs: Any) -> SyntheticTask:
    """Build a task by name (``"distance"``, ``"count"`` or ``"retrieve"``); unknown names or fields raise ValueError."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(map(repr, TASKS))}")
    cls = TASKS[name]
    try:
        return cls(**kwargs)
    except TypeError as e:  # an unknown keyword
        raise ValueError(f"bad arguments for {cls.__name__}: {e}") from e


def task_from_dict(d: dict[str, Any]) -> SyntheticTask:
    """Invert :meth:`SyntheticTask.to_dict`."""
    if not isinstance(d, dict) or "name" not in d:
        raise ValueError(f"task dict must have a 'name' key, got {d!r}")
    fields = dict(d)
    return make_task(fields.pop("name"), **fields)


__all__ = [
    "PAD_ID",
    "TASKS",
    "Batch",
    "CountTask",
    "CounterfactualPairs",
    "DistanceTask",
    "RetrieveTask",
    "SyntheticTask",
    "derive_seed",
    "make_task",
    "row_hashes",
    "task_from_dict",
]

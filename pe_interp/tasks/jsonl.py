"""The authors' JSONL data format: one ``{"text": "...", "distance": d}`` object per line.

Token id ``i`` is rendered as the word ``w{i}``; words are space-separated and pads are omitted.
The label is written as the task-level value (a distance, or a count), not as a class index. The
authors store the Task-2 count under the key ``"distance"`` too (paper digest §3), so both tasks
write that key; reading a count file also accepts ``"count"``.
"""

from __future__ import annotations

import json
import re
from os import PathLike
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from pe_interp.tasks.batch import PAD_ID, Batch

_WORD = re.compile(r"w(\d+)")


class JsonlTask(Protocol):
    """What the format needs of a task (every :class:`pe_interp.tasks.SyntheticTask` has it)."""

    name: str
    jsonl_label_key: str
    d_vocab: int

    @property
    def max_len(self) -> int: ...

    @property
    def label_values(self) -> Tensor: ...

    def _label_to_class(self) -> dict[int, int]: ...


def write_jsonl(task: JsonlTask, batch: Batch, path: str | PathLike[str]) -> None:
    """Write ``batch`` (on any device) to ``path``, one line per row."""
    batch = batch.to("cpu").validate(task.d_vocab)
    if batch.max_len > task.max_len:
        raise ValueError(f"batch has {batch.max_len} columns, more than {task}.max_len")
    values = task.label_values.tolist()
    if len(batch) and int(batch.labels.max()) >= len(values):
        raise ValueError(f"batch has class indices >= n_classes={len(values)}")
    key = task.jsonl_label_key
    with Path(path).open("w", encoding="utf-8") as f:
        for row, length, label in zip(
            batch.tokens.tolist(), batch.lengths.tolist(), batch.labels.tolist()
        ):
            text = " ".join(f"w{t}" for t in row[:length])
            f.write(json.dumps({"text": text, key: values[label]}) + "\n")


def read_jsonl(task: JsonlTask, path: str | PathLike[str]) -> Batch:
    """Read a JSONL file into a batch padded to ``task.max_len``. Blank lines are skipped.

    Raises ValueError naming the file and the line number for any malformed line: invalid JSON,
    a missing key, a word that is not ``w<id>``, an id outside ``1..d_vocab-1``, too many words,
    or a label value the task cannot produce.
    """
    keys = [task.jsonl_label_key] + (["count"] if task.name == "count" else [])
    to_class = task._label_to_class()
    rows: list[list[int]] = []
    labels: list[int] = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue

            def fail(why: str, lineno: int = lineno) -> ValueError:
                return ValueError(f"{path}:{lineno}: {why}")

            try:
                obj: Any = json.loads(line)
            except json.JSONDecodeError as e:
                raise fail(f"invalid JSON ({e.msg})") from e
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise fail('expected an object with a string "text"')
            key = next((k for k in keys if k in obj), None)
            if key is None:
                raise fail(f"missing the label key {keys[0]!r}")
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, int) or value not in to_class:
                raise fail(f"{key}={value!r} is not a label value of {task.name!r}")
            ids = []
            for word in obj["text"].split():
                match = _WORD.fullmatch(word)
                if match is None:
                    raise fail(f"word {word!r} is not of the form w<id>")
                token = int(match.group(1))
                if not PAD_ID < token < task.d_vocab:
                    raise fail(f"token id {token} is outside 1..{task.d_vocab - 1}")
                ids.append(token)
            if not 1 <= len(ids) <= task.max_len:
                raise fail(f"{len(ids)} words; expected 1..{task.max_len}")
            rows.append(ids)
            labels.append(to_class[value])

    if not rows:
        return Batch.empty(task.max_len)
    tokens = torch.full((len(rows), task.max_len), PAD_ID, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    pad_mask = torch.arange(task.max_len) < lengths[:, None]
    tokens[pad_mask] = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    return Batch(tokens, torch.tensor(labels, dtype=torch.long), pad_mask)

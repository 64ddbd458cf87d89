"""A user's own prompts: a JSONL file, one object a line, read into a :class:`PromptSet`.

Fields: ``prompt`` and ``answer`` (strings), and optionally ``counterfactual_prompt`` with
``counterfactual_answer`` (both or neither). The answer's tokens are those the tokenizer gives
after the prompt's when it encodes prompt + answer (else the answer encoded alone): write the
answer as the model would continue, e.g. ``" Paris"`` with its space. The label is the answer's
first token; a longer answer is scored on it, and :meth:`PromptSet.describe` says so. A
counterfactual prompt must have as many tokens as its prompt (pairs line up position by
position) and a different first answer token. Every bad line is one ValueError naming the file
and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from pe_interp.prompts.batch import PromptPairs, PromptSet, assemble, assemble_pairs
from pe_interp.prompts.vocab import (
    BosPolicy,
    bos_policy,
    context_limit,
    encode,
    is_tokenizer,
    model_vocab_size,
    resolve_tokenizer,
)

FIELDS = ("prompt", "answer", "counterfactual_prompt", "counterfactual_answer")


@dataclass(frozen=True, eq=False)
class UserPrompts:
    """What :func:`load_jsonl` read: ``prompts`` (every line), ``counterfactuals`` (the lines with
    a counterfactual, as pairs; None where no line has one) and ``pair_lines`` (their line numbers)."""

    prompts: PromptSet
    counterfactuals: PromptPairs | None
    pair_lines: tuple[int, ...]


@dataclass(frozen=True)
class _Checker:
    """One line's checks against the tokenizer, the model's vocabulary and its longest prompt."""

    where: str
    tokenizer: Any
    bos: BosPolicy
    vocab: int | None
    limit: tuple[int | None, str]

    def fail(self, line: int, message: str) -> ValueError:
        return ValueError(f"{self.where}:{line}: {message}")

    def prompt(self, line: int, text: str, name: str) -> list[int]:
        ids = encode(self.tokenizer, text)
        if not ids:
            raise self.fail(line, f"{name} tokenizes to no token")
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is not None and pad in ids:
            raise self.fail(line, f"{name} holds the pad token (id {pad}), which pads are told by")
        if self.vocab is not None and max(ids) >= self.vocab:
            raise self.fail(
                line,
                f"{name} holds token id {max(ids)}, outside the model's vocabulary ({self.vocab})",
            )
        n = len(ids) + int(self.bos.prepended)
        limit, what = self.limit
        if limit is not None and n > limit:
            raise self.fail(
                line,
                f"{name} has {n} tokens{' with BOS' if self.bos.prepended else ''}, more than the "
                f"model's {what} of {limit}",
            )
        return ids

    def answer(
        self, line: int, prompt_ids: list[int], prompt: str, text: str, name: str
    ) -> list[int]:
        joint = encode(self.tokenizer, prompt + text)
        k = len(prompt_ids)
        ids = (
            joint[k:]
            if joint[:k] == prompt_ids and len(joint) > k
            else encode(self.tokenizer, text)
        )
        if not ids:
            raise self.fail(line, f"{name} {text!r} tokenizes to no token")
        first, unk = ids[0], getattr(self.tokenizer, "unk_token_id", None)
        if (
            unk is not None
            and first == unk
            and text.strip() != getattr(self.tokenizer, "unk_token", None)
        ):
            raise self.fail(
                line,
                f"{name} {text!r} is not in the vocabulary (its first token is the unknown token, id {unk})",
            )
        if self.vocab is not None and first >= self.vocab:
            raise self.fail(
                line,
                f"{name} {text!r} starts with token id {first}, outside the model's vocabulary ({self.vocab})",
            )
        return ids


def load_jsonl(
    path: str | PathLike[str],
    tokenizer: Any,
    *,
    model: Any = None,
    bos: bool | str = "auto",
    family: str | None = None,
) -> UserPrompts:
    """Read a prompts file (module docstring) into :class:`UserPrompts`.

    ``tokenizer``: a tokenizer, a model directory, a TransformerBridge or a BridgedModel (its
    tokenizer); ``model``: where the vocabulary size and the longest prompt are read (a config, a
    model, a bridge or a directory; default ``tokenizer`` where it is not a bare tokenizer; None:
    no such checks). ``bos`` as :func:`~pe_interp.prompts.vocab.bos_policy`; ``family``: the
    set's name (default: the file's stem). One-line ValueErrors name the file and the line."""
    path = Path(path)
    tok = resolve_tokenizer(tokenizer)
    source = model if model is not None else (None if is_tokenizer(tokenizer) else tokenizer)
    check = _Checker(
        str(path),
        tok,
        bos_policy(tok, bos),
        None if source is None else model_vocab_size(source),
        (None, "") if source is None else context_limit(source),
    )
    lines = read_lines(path)
    prompts: list[list[int]] = []
    answers: list[list[int]] = []
    texts: list[str] = []
    pairs: list[tuple[int, int, list[int], list[int], str]] = []  # line, row, prompt, answer, text
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        record = _record(check, number, raw)
        ids = check.prompt(number, record["prompt"], "prompt")
        prompts.append(ids)
        answers.append(check.answer(number, ids, record["prompt"], record["answer"], "answer"))
        texts.append(record["answer"])
        if "counterfactual_prompt" in record:
            cf = check.prompt(number, record["counterfactual_prompt"], "counterfactual_prompt")
            if len(cf) != len(ids):
                raise check.fail(
                    number,
                    f"counterfactual_prompt has {len(cf)} tokens and prompt {len(ids)}: a pair must "
                    "line up position by position",
                )
            text = record["counterfactual_answer"]
            cf_answer = check.answer(
                number, cf, record["counterfactual_prompt"], text, "counterfactual_answer"
            )
            if cf_answer[0] == answers[-1][0]:
                raise check.fail(
                    number,
                    f"counterfactual_answer starts with the answer's token (id {cf_answer[0]}): a "
                    "counterfactual must change the answer",
                )
            pairs.append((number, len(prompts) - 1, cf, cf_answer, text))
    if not prompts:
        raise ValueError(f"{path}: no prompts (one JSON object a line)")
    name = family or path.stem
    full = assemble(name, tok, prompts, answers, texts, check.bos)
    if not pairs:
        return UserPrompts(full, None, ())
    rows = [p[1] for p in pairs]
    clean = ([prompts[i] for i in rows], [answers[i] for i in rows], [texts[i] for i in rows])
    corrupt = ([p[2] for p in pairs], [p[3] for p in pairs], [p[4] for p in pairs])
    moved = all(sorted(a) == sorted(b) for a, b in zip(clean[0], corrupt[0], strict=True))
    counterfactuals = assemble_pairs(
        name, tok, clean, corrupt, check.bos, "position" if moved else "content"
    )
    return UserPrompts(full, counterfactuals, tuple(p[0] for p in pairs))


def read_lines(path: str | PathLike[str]) -> list[str]:
    """The file's lines as common editors save them: UTF-8 with or without a byte-order mark,
    LF or CRLF line ends; a one-line ValueError where it cannot be read."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the prompts file ({err})") from None
    # lines end at LF alone: a JSON string may hold U+2028 and the like, which splitlines() splits at
    return [line.removesuffix("\r") for line in text.split("\n")]


def count_counterfactuals(path: str | PathLike[str]) -> int | None:
    """How many lines of the prompts file give a ``counterfactual_prompt``, read as JSON alone,
    without a tokenizer: what a caller checks before it loads a model. None where the file cannot
    be read (:func:`load_jsonl` says why, line by line)."""
    try:
        lines = read_lines(path)
    except ValueError:
        return None
    n = 0
    for raw in lines:
        try:
            record = json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError:
            return None
        n += isinstance(record, dict) and "counterfactual_prompt" in record
    return n


def _record(check: _Checker, number: int, raw: str) -> dict[str, str]:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as err:
        raise check.fail(number, f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise check.fail(number, f"a line must be a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise check.fail(
            number, f"unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}"
        )
    for name in ("prompt", "answer"):
        if name not in record:
            raise check.fail(number, f"missing field {name!r}")
    has = [name in record for name in FIELDS[2:]]
    if any(has) and not all(has):
        given, missing = (FIELDS[2], FIELDS[3]) if has[0] else (FIELDS[3], FIELDS[2])
        raise check.fail(number, f"{given} without {missing}: give both or neither")
    for name, value in record.items():
        if not isinstance(value, str):
            raise check.fail(number, f"{name} must be a string, got {type(value).__name__}")
    return record


__all__ = ["FIELDS", "UserPrompts", "count_counterfactuals", "load_jsonl", "read_lines"]

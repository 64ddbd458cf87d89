"""Named spans of a prompt family's positions, as its template lays them out (what a
position-aware circuit keeps an edge at; :meth:`pe_interp.tasks.Task.spans` for the synthetic
tasks). Every row of a family has one layout (its pieces are encoded once each and concatenated),
so the spans are the layout's, with the answer's slot read from the row's label where it moves.

- :func:`induction_spans` (``INDUCTION_SPANS``): ``bos``; the first copy: ``prefix`` (the tokens
  that are repeated, but the last), ``cue`` (the last of them: the token before the answer),
  ``answer`` (the answer token), ``after`` (the rest of the first copy); the second copy:
  ``repeat`` (but its last token) and ``query`` (the last position, the cue again). A position
  counterfactual swaps ``answer`` with one position of ``after``.
- :func:`list_spans` (``RECALL_SPANS``, ``SUCCESSOR_SPANS``): ``bos``, ``shots`` (the worked
  examples), ``before`` (``"List:"`` and the items and separators before the answer), ``cue``
  (Successor: the item the question names), ``answer``, ``after`` (the list's rest, ``"."``
  included), ``question`` (but ``named``, Successor's named item, and its last token) and
  ``last``. A position counterfactual swaps ``answer`` with an item of ``before`` or ``after``.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

INDUCTION_SPANS = ("bos", "prefix", "cue", "answer", "after", "repeat", "query")
RECALL_SPANS = ("bos", "shots", "before", "answer", "after", "question", "last")
SUCCESSOR_SPANS = (
    "bos",
    "shots",
    "before",
    "cue",
    "answer",
    "after",
    "question",
    "named",
    "last",
)


def _check_width(name: str, batch, width: int) -> None:
    """A one-line error unless every row holds ``width`` real tokens (the family's layout)."""
    if not bool(batch.pad_mask.all()):
        raise ValueError(
            f"{name}: spans need prompts of one length (the family's layout); these rows are padded "
            "to unequal lengths"
        )
    if batch.tokens.shape[1] != width:
        raise ValueError(
            f"{name}: the family lays out {width} tokens, these rows hold {batch.tokens.shape[1]}"
        )


def induction_spans(family, batch) -> Int[Tensor, "batch pos"]:
    """Each position's index into :data:`INDUCTION_SPANS` (module docstring) for rows of the
    :class:`~pe_interp.prompts.Induction` ``family``."""
    off = int(family.bos_used.prepended)
    r, k = family.n_random, family.n_repeat
    _check_width(family.name, batch, off + r + k)
    tokens = batch.tokens
    if not torch.equal(tokens[:, off + r :], tokens[:, off : off + k]):
        raise ValueError(f"{family.name}: a row's second copy is not its first {k} tokens")
    ids = [0] * off + [1] * (k - 1) + [2, 3] + [4] * (r - k - 1) + [5] * (k - 1) + [6]
    return torch.as_tensor(ids, device=tokens.device).expand(tokens.shape).clone()


def list_layout(family) -> tuple[int, int, int]:
    """``(shots' tokens, the list's tokens, the question's tokens)`` of a list ``family``; a
    one-line error where its questions differ in length (then its rows do too)."""
    pieces = family._pieces
    n = family.n_list
    listed = len(pieces[family.prefix]) + n + (n - 1) * len(pieces[family.separator])
    listed += len(pieces[family.end])
    lengths = family.question_lengths()
    if len(set(lengths)) != 1:
        raise ValueError(
            f"{family.name}: its questions are {min(lengths)} to {max(lengths)} tokens long, so its "
            "rows have no one layout to name spans of"
        )
    question = lengths[0]
    demo = listed + question + 1 + len(pieces[family.demo_end])
    return family.shots * demo, listed, question


def list_spans(family, batch) -> Int[Tensor, "batch pos"]:
    """Each position's index into the list ``family``'s ``span_names`` (:data:`RECALL_SPANS` or
    :data:`SUCCESSOR_SPANS`, module docstring): the answer's slot is where the row's label sits
    in its list."""
    names = family.span_names
    off = int(family.bos_used.prepended)
    shots, listed, question = list_layout(family)
    width = off + shots + listed + question
    _check_width(family.name, batch, width)
    tokens, labels = batch.tokens, batch.labels.to(batch.tokens.device)
    start = off + shots  # the list's first token
    step = 1 + len(family._pieces[family.separator])
    items = start + len(family._pieces[family.prefix]) + step * torch.arange(family.n_list)
    hit = tokens[:, items.to(tokens.device)] == labels[:, None]  # [b, n_list]
    if not bool((hit.sum(1) == 1).all()):
        row = int((hit.sum(1) != 1).nonzero()[0])
        raise ValueError(f"{family.name}: row {row}'s answer is not once in its list")
    answer = items.to(tokens.device)[hit.to(torch.int8).argmax(1)][:, None]  # [b, 1]
    pos = torch.arange(width, device=tokens.device)[None]
    end = start + listed  # the question's first token
    out = torch.full_like(tokens, names.index("question"))
    out = torch.where(pos < end, names.index("after"), out)
    out = torch.where(pos < answer, names.index("before"), out)
    out = torch.where(pos == answer, names.index("answer"), out)
    if "cue" in names:  # Successor: the item before the answer, which the question names
        out = torch.where(pos == answer - step, names.index("cue"), out)
        out[:, end + len(family._around[0])] = names.index("named")
    out[:, off:start] = names.index("shots")
    out[:, :off] = names.index("bos")
    out[:, -1] = names.index("last")
    return out


__all__ = [
    "INDUCTION_SPANS",
    "RECALL_SPANS",
    "SUCCESSOR_SPANS",
    "induction_spans",
    "list_layout",
    "list_spans",
]

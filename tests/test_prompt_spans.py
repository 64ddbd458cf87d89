"""Named spans of the prompt families' positions (pe_interp.prompts.spans), checked against the
rendered tokens: each span holds what the template put there (the answer span the answer, the
repeat the first copy, the question the asked ordinal or item), the position counterfactual's
two moved positions land where the module docstring says, and rows with no one layout refuse in
one line."""

from __future__ import annotations

import json
from functools import cached_property

import pytest
import torch
from prompt_env import make_tokenizer

from pe_interp.prompts import Induction, RecallByIndex, Successor, load_jsonl
from pe_interp.prompts.task import PromptTask
from pe_interp.prompts.words import ORDINALS
from pe_interp.tasks.batch import Batch

TOK = make_tokenizer()
N = 32


def _masks(family, prompts) -> dict[str, torch.Tensor]:
    spans = family.spans(prompts.batch)
    assert spans.shape == prompts.tokens.shape
    return {name: spans == i for i, name in enumerate(family.span_names)}


def _words(ids) -> list[str]:
    return [TOK.convert_ids_to_tokens(int(i)) for i in ids]


@pytest.mark.parametrize("bos", [True, False])
def test_induction_spans_hold_the_rendered_copies(bos):
    fam = Induction(TOK, bos=bos)
    pairs = fam.counterfactuals(N, "position", seed=3)
    tokens, at = pairs.clean.tokens, _masks(fam, pairs.clean)
    per_row = {name: m.sum(1).unique().tolist() for name, m in at.items()}
    k, r = fam.n_repeat, fam.n_random
    assert per_row == {
        "bos": [int(bos)], "prefix": [k - 1], "cue": [1], "answer": [1],
        "after": [r - k - 1], "repeat": [k - 1], "query": [1],
    }  # fmt: skip
    if bos:
        assert (tokens[at["bos"]] == TOK.bos_token_id).all() and bool(at["bos"][:, 0].all())
    assert torch.equal(tokens[at["answer"]], pairs.clean.labels)  # one per row, in row order
    assert torch.equal(tokens[at["repeat"]], tokens[at["prefix"]])
    assert torch.equal(tokens[at["query"]], tokens[at["cue"]]) and bool(at["query"][:, -1].all())
    # the counterfactual moves the answer into `after` and one `after` token into the answer slot
    moved = pairs.changed
    assert moved.sum(1).eq(2).all() and (moved & at["answer"]).sum(1).eq(1).all()
    assert (moved & at["after"]).sum(1).eq(1).all()
    assert torch.equal(pairs.corrupt.tokens[at["answer"]], pairs.corrupt.labels)


def _question_words(template: str, **fields) -> list[str]:
    return template.format(**fields).split()


def test_recall_spans_hold_the_list_and_the_asked_ordinal():
    fam = RecallByIndex(TOK)
    pairs = fam.counterfactuals(N, "position", seed=1)
    tokens, at = pairs.clean.tokens, _masks(fam, pairs.clean)
    assert torch.equal(tokens[at["answer"]], pairs.clean.labels)
    seen = set()
    for b in range(N):
        listed = _words(tokens[b][at["before"][b] | at["answer"][b] | at["after"][b]])
        assert listed[0] == fam.prefix and listed[-1] == fam.end
        items = listed[1:-1:2]  # "List:", item, ",", item, ..., "."
        assert len(items) == fam.n_list and set(listed[2:-1:2]) == {fam.separator}
        slot = items.index(_words([pairs.clean.labels[b]])[0])
        question = _words(tokens[b][at["question"][b] | at["last"][b]])
        assert question == _question_words(fam.question, ordinal=ORDINALS[slot])
        shots = _words(tokens[b][at["shots"][b]])
        assert shots[0] == fam.prefix and shots[-1] == "." and len(shots) == 20
        seen.add(slot)
    assert seen == set(range(fam.n_list))  # the answer's slot moves from row to row
    moved = pairs.changed
    assert moved.sum(1).eq(2).all() and (moved & at["answer"]).sum(1).eq(1).all()
    assert (moved & (at["before"] | at["after"])).sum(1).eq(1).all()


def test_successor_spans_hold_the_named_item_and_its_cue():
    fam = Successor(TOK)
    pairs = fam.counterfactuals(N, "position", seed=2)
    tokens, at = pairs.clean.tokens, _masks(fam, pairs.clean)
    assert torch.equal(tokens[at["answer"]], pairs.clean.labels)
    assert torch.equal(tokens[at["named"]], tokens[at["cue"]])
    cue = at["cue"].to(torch.int8).argmax(1)
    assert torch.equal(cue + 2, at["answer"].to(torch.int8).argmax(1))  # item, ",", answer
    for b in range(N):
        named = _words(tokens[b][at["named"][b]])[0]
        question = _words(tokens[b][at["question"][b] | at["named"][b] | at["last"][b]])
        asked = " ".join((fam.question[0], named, fam.question[1]))
        assert question == _question_words(asked)
    moved = pairs.changed  # never the cue, which the question names
    assert moved.sum(1).eq(2).all() and not bool((moved & at["cue"]).any())
    assert (moved & (at["before"] | at["after"])).sum(1).eq(1).all()


class _UnevenRecall(RecallByIndex):
    """Recall whose first question is one token longer than the others."""

    @cached_property
    def _questions(self) -> list[list[int]]:
        qs = [list(q) for q in super()._questions]
        return [qs[0] + qs[0][-1:], *qs[1:]]


def test_rows_with_no_one_layout_refuse_in_one_line(tmp_path):
    fam = Induction(TOK)
    batch = fam.sample(4).batch
    padded = Batch(batch.tokens, batch.labels, batch.pad_mask.clone())
    padded.pad_mask[0, -1] = False
    with pytest.raises(ValueError, match=r"^induction: spans need prompts of one length"):
        fam.spans(padded)
    short = Batch(batch.tokens[:, :-1], batch.labels, batch.pad_mask[:, :-1])
    with pytest.raises(
        ValueError, match=r"^induction: the family lays out 19 tokens, these .* 18$"
    ):
        fam.spans(short)
    uneven = _UnevenRecall(TOK)
    with pytest.raises(ValueError, match=r"^recall: its questions are 7 to 8 tokens long"):
        uneven.spans(uneven.sample(4).batch)
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "desk coin desk", "answer": " coin"}) + "\n")
    user = load_jsonl(path, TOK)
    task = PromptTask(str(path), None, user, len(TOK), 1)
    assert task.span_names == ()
    with pytest.raises(ValueError, match=r"mine.jsonl: a prompts file names no spans"):
        task.spans(user.prompts.batch)

"""Positional tasks for pretrained models, in natural tokens (issue 47, item 2).

- :mod:`pe_interp.prompts.families`: seeded prompt families over any Hugging Face tokenizer:
  :class:`Induction` (repeated random tokens), :class:`RecallByIndex` (``"... The third item in the
  list is"``), :class:`Successor` (``"... In the list, after dog comes"``), each with
  position-only and content counterfactuals (``family.counterfactuals(n, kind=...)``).
- :func:`load_jsonl`: a user's own prompts (``prompt``, ``answer``, optionally
  ``counterfactual_prompt`` and ``counterfactual_answer``).
- :class:`PromptSet`, :class:`PromptPairs`: right-padded token ids, labels (each answer's first
  token id), pad mask, answers, BOS policy, shaped as the probes read a batch
  (``pairs.clean.tokens``, ``pairs.corrupt.labels``, ``pairs.pad_mask``).
- :class:`PromptTask` (:mod:`pe_interp.prompts.task`): a family or a prompts file as a run's task,
  which every command that reads a run reads (``pe-interp ablate model.gguf --task induction``).
- :func:`family_accuracy`: the model's greedy next-token accuracy on a set, with a one-line
  summary that records the BOS policy and says when answers are scored on their first token.

With ``BridgedModel(bridge)`` (``answers=None``: a class is a token id) the sets go to the probes
as they are, e.g. ``probes.route_shares(model, pairs.clean.tokens, pairs.corrupt.tokens,
pairs.clean.labels, pairs.corrupt.labels, pad_mask=pairs.pad_mask)``; where the tokenizer has no
pad token, build the model with ``pad_id=prompts.pad_id``.
"""

from __future__ import annotations

from pe_interp.prompts.accuracy import (
    FamilyAccuracy,
    check_fits,
    family_accuracy,
    format_accuracies,
)
from pe_interp.prompts.batch import PAIR_KINDS, PromptPairs, PromptSet
from pe_interp.prompts.families import (
    FAMILIES,
    Induction,
    PromptFamily,
    RecallByIndex,
    Successor,
    make_family,
)
from pe_interp.prompts.jsonl import UserPrompts, load_jsonl
from pe_interp.prompts.task import PromptTask, is_prompt_task, load_prompt_task
from pe_interp.prompts.vocab import BosPolicy, context_limit, resolve_tokenizer

__all__ = [
    "FAMILIES",
    "PAIR_KINDS",
    "BosPolicy",
    "FamilyAccuracy",
    "Induction",
    "PromptFamily",
    "PromptPairs",
    "PromptSet",
    "PromptTask",
    "RecallByIndex",
    "Successor",
    "UserPrompts",
    "check_fits",
    "context_limit",
    "family_accuracy",
    "format_accuracies",
    "is_prompt_task",
    "load_jsonl",
    "load_prompt_task",
    "make_family",
    "resolve_tokenizer",
]

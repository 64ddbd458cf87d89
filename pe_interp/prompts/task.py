"""A prompt family, or a user's prompts file, as the task of a run: what lets every command that
reads a run (``ablate``, ``patch``, ``routes``, ``decompose``, ``heads``) read a pretrained model
on natural prompts (``pe-interp ablate model.gguf --task induction``).

A run's task gives its evaluation split (:meth:`PromptTask.splits`: no training split; the held-out
split is ``family.sample(n, seed)``) and its counterfactual pairs (:meth:`PromptTask.counterfactuals`),
as the synthetic tasks do, in token ids of the model's own vocabulary: a class is a token id
(``BridgedModel(bridge, answers=None)``). :attr:`PromptTask.prompts` keeps the prompt set itself
(answers, BOS policy, pad id), which the run's accuracy line reads (:func:`prompt_accuracy`),
and a family's named spans (:attr:`PromptTask.span_names`, :meth:`PromptTask.spans`), which
position-aware circuits read.

A prompts file (``--task my_prompts.jsonl``, :func:`pe_interp.prompts.load_jsonl`) has a fixed
set of prompts: its split is the file's lines in order, and its counterfactuals are the lines that
give one (``kind="position"`` or ``"content"``: the file does not say which, so either kind
returns them, and the pairs' ``kind`` records ``"user"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import Tensor

from pe_interp.prompts.accuracy import check_fits
from pe_interp.prompts.batch import PromptPairs, PromptSet
from pe_interp.prompts.families import FAMILIES, PromptFamily, make_family
from pe_interp.prompts.jsonl import UserPrompts, load_jsonl
from pe_interp.tasks.batch import Batch, CounterfactualPairs

# how many prompts a preset draws (``--preset``); commands take the first ``--n`` of them
PROMPT_COUNTS = {"smoke": 16, "quick": 64, "mid": 256, "paper": 1024}


def is_prompt_task(task: str | None) -> bool:
    """True for a prompt family's name (:data:`~pe_interp.prompts.FAMILIES`) or a ``.jsonl`` path."""
    return task is not None and (task in FAMILIES or str(task).endswith(".jsonl"))


@dataclass(frozen=True)
class PromptSplits:
    """What a run reads of its training config, for prompts: no training split, ``n_test``
    held-out prompts drawn with ``seed``, no ignored class."""

    n_test: int
    seed: int = 0
    n_train: int = 0
    ignore_index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"n_train": 0, "n_test": self.n_test, "seed": self.seed}


@dataclass(frozen=True, eq=False)
class PromptTask:
    """A prompt family (``source`` its name) or a user's prompts file (``source`` its path) as a
    run's task over ``vocab_size`` token ids (module docstring)."""

    source: str
    family: PromptFamily | None
    user: UserPrompts | None
    vocab_size: int
    n: int
    seed: int = 0

    @property
    def name(self) -> str:
        return self.family.name if self.family is not None else Path(self.source).stem

    @property
    def n_classes(self) -> int:
        """Classes are the model's token ids."""
        return self.vocab_size

    @cached_property
    def prompts(self) -> PromptSet:
        """The held-out prompts themselves (answers, BOS policy, pad id)."""
        if self.user is not None:
            return self.user.prompts
        return self.family.sample(self.n, self.seed)

    @property
    def max_len(self) -> int:
        return int(self.prompts.tokens.shape[1])

    @property
    def pad_id(self) -> int:
        return self.prompts.pad_id

    def splits(self, n_train: int, n_test: int, seed: int = 0) -> tuple[Batch, Batch]:
        """No training split; the held-out split is the first ``n_test`` prompts."""
        test = self.prompts.batch
        test = test[: min(n_test, len(test))]
        return Batch.empty(test.tokens.shape[1]), test

    def prompt_pairs(self, n: int, kind: str = "position", seed: int = 0) -> PromptPairs:
        """``n`` clean/corrupt prompt pairs of ``kind`` (a file's: its first ``n`` pairs)."""
        if self.user is not None:
            if self.user.counterfactuals is None:
                raise ValueError(
                    f"{self.source}: no line gives a counterfactual_prompt, so there are no "
                    "pairs to patch or move"
                )
            return self.user.counterfactuals[: min(n, len(self.user.counterfactuals))]
        return self.family.counterfactuals(n, kind=kind, seed=seed)

    def counterfactuals(self, n: int, kind: str = "position", seed: int = 0) -> CounterfactualPairs:
        """The pairs as the synthetic tasks give them (:class:`~pe_interp.tasks.CounterfactualPairs`)."""
        return self.prompt_pairs(n, kind, seed).counterfactual_pairs

    def counterfactual_pairs(self, n: int, seed: int = 0) -> CounterfactualPairs:
        """Position-only pairs (what ``pe-interp patch`` patches)."""
        return self.counterfactuals(n, "position", seed)

    @property
    def span_names(self) -> tuple[str, ...]:
        """The family's named spans (:mod:`pe_interp.prompts.spans`); a prompts file has none."""
        return () if self.family is None else self.family.span_names

    def spans(self, batch: Batch) -> Tensor:
        """Each position's index into :attr:`span_names`, ``[batch, pos]``; a one-line error for
        a prompts file (its prompts have no layout) or rows of unequal length."""
        if self.family is None:
            raise ValueError(
                f"{self.source}: a prompts file names no spans of its prompts' positions"
            )
        return self.family.spans(batch)

    def decode(self, ids: list[int]) -> list[str]:
        """Each id as its token's text (attention views' labels)."""
        tok = self.family.tokenizer if self.family is not None else None
        if tok is None:
            return [str(i) for i in ids]
        return [tok.decode([int(i)]) for i in ids]

    def to_dict(self) -> dict[str, Any]:
        """What a result records of the prompts: the family and its fields (or the file), the
        number drawn, the seed, the BOS policy, the pad id and the scoring of multi-token answers."""
        prompts = self.prompts
        out: dict[str, Any] = {
            "name": self.name,
            "kind": "prompt family" if self.family is not None else "prompts file",
            "source": self.source,
            "n": len(prompts),
            "seed": self.seed,
            "bos": prompts.bos.to_dict(),
            "pad_id": prompts.pad_id,
            "pad_source": prompts.pad_source,
            "scored_on_first_token": prompts.n_multi_token > 0,
            "n_multi_token": prompts.n_multi_token,
        }
        if self.family is not None:
            out["family"] = self.family.describe()
        return out


def load_prompt_task(
    source: str, bridge: Any, preset: str = "quick", seed: int = 0, where: Any = None
) -> PromptTask:
    """The prompt family ``source`` (a name in :data:`~pe_interp.prompts.FAMILIES`) over the
    bridge's tokenizer, ``PROMPT_COUNTS[preset]`` prompts drawn with ``seed``; or the prompts
    file ``source`` read with the bridge's tokenizer and checked against its vocabulary and
    context. One-line ValueErrors, prefixed with ``where`` (the model's path)."""
    prefix = f"{where}: " if where is not None else ""
    if preset not in PROMPT_COUNTS:
        raise ValueError(
            f"{prefix}--preset must be one of {', '.join(PROMPT_COUNTS)} for prompts; got {preset!r}"
        )
    tokenizer = getattr(bridge, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"{prefix}the model has no tokenizer: save it with its tokenizer "
            "(tokenizer.save_pretrained(dir)) to probe it on natural prompts"
        )
    vocab = int(bridge.cfg.d_vocab)
    if source in FAMILIES:
        family = make_family(source, tokenizer)
        task = PromptTask(source, family, None, vocab, PROMPT_COUNTS[preset], seed)
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"{prefix}--task {source}: no such prompts file")
        user = load_jsonl(path, tokenizer, model=bridge)
        task = PromptTask(str(path), None, user, vocab, len(user.prompts), seed)
    try:  # longer than the context or a sliding window, ids outside the vocabulary
        check_fits(bridge, task.prompts)
    except ValueError as err:
        raise ValueError(f"{prefix}{err}") from None
    return task


__all__ = [
    "PROMPT_COUNTS",
    "PromptSplits",
    "PromptTask",
    "is_prompt_task",
    "load_prompt_task",
]

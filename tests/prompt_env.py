"""A word-level tokenizer over the prompt templates' words and 40 common nouns, for the tests of
natural prompts (tests/test_prompts.py, tests/test_prompt_runs.py)."""

from __future__ import annotations

from pe_interp.prompts import RecallByIndex, Successor
from pe_interp.prompts.words import COMMON_WORDS, ORDINALS

SPECIALS = ["[PAD]", "[UNK]", "<s>"]


def _vocab() -> list[str]:
    words = list(SPECIALS) + list(COMMON_WORDS[:40])
    text = [RecallByIndex.prefix, RecallByIndex.separator, RecallByIndex.end]
    text += [RecallByIndex.demo_end, *Successor.question, "Paris is the capital of France"]
    text += [RecallByIndex.question.format(ordinal=o) for o in ORDINALS]
    for piece in text:
        words += [w for w in piece.split() if w not in words]
    return words


def make_tokenizer(bos: bool = True):
    """A word-level tokenizer over the templates' words and 40 common nouns."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(_vocab())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    extra = {"bos_token": "<s>"} if bos else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", **extra
    )

"""Common English nouns the prompt families draw their items from.

A family keeps only the words its tokenizer encodes as one token with a leading space (``" dog"``)
(:func:`pe_interp.prompts.vocab.word_pool`), so the same list serves any tokenizer; where too few
survive, the families that allow it draw random token ids instead.
"""

from __future__ import annotations

_WORDS = """
    apple bag ball bank bed bell bird boat body bone book boot bottle box boy bread brick bridge
    brother bus cake camera car card cat chair cheese chicken child church city clock cloud coat
    coffee coin corn cow cup desk dog door dress duck egg engine eye face farm field fire fish flag
    floor flower foot fork fox garden gate girl glass gold grass hair hand hat head heart horse
    house ice island jacket key king kitchen knife lake lamp leaf leg letter lion map milk monkey
    moon mother mountain mouse mouth nose ocean orange paper park pen pencil phone piano pig plane
    plate pocket queen rabbit rain ring river road rock roof room rope salt sand school sea seed
    sheep ship shirt shoe shop silver sister sky snake snow sock sofa song spoon star stone street
    sugar sun table tea teacher tent tiger toe tooth towel tower town toy train tree truck wall
    watch water whale wheel window wine wing winter wolf wood
"""
COMMON_WORDS: tuple[str, ...] = tuple(_WORDS.split())

ORDINALS: tuple[str, ...] = (
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
)

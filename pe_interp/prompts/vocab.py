"""What the prompt families read of a tokenizer and a model, generically (no model is special-cased):
the tokenizer itself (:func:`resolve_tokenizer`), the BOS policy (:func:`bos_policy`), the pad id
(:func:`pad_choice`), the pools of single-token items (:func:`word_pool`, :func:`id_pool`), and the
longest prompt a model takes (:func:`context_limit`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_interp.prompts.words import COMMON_WORDS

# where a Hugging Face config keeps its context length, in the order they are read
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len")


@dataclass(frozen=True)
class BosPolicy:
    """How a prompt set handled BOS: ``prepended`` (one ``token_id`` before every prompt) or not,
    and why (``reason``: ``"auto"``, ``"asked"``, ``"off"``, ``"tokenizer has none"``)."""

    prepended: bool
    token_id: int | None
    token: str | None
    reason: str

    def describe(self) -> str:
        """One phrase: ``"BOS '<s>' (id 1) prepended"`` or ``"no BOS (tokenizer has none)"``."""
        if self.prepended:
            return f"BOS {self.token!r} (id {self.token_id}) prepended"
        return f"no BOS ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        """The policy as JSON-able fields."""
        return {
            "prepended": self.prepended,
            "token_id": self.token_id,
            "token": self.token,
            "reason": self.reason,
        }


def is_tokenizer(obj: Any) -> bool:
    """True for a Hugging Face tokenizer (anything with ``encode``, ``decode`` and ``all_special_ids``)."""
    return all(hasattr(obj, name) for name in ("encode", "decode", "all_special_ids"))


def resolve_tokenizer(source: Any) -> Any:
    """The tokenizer of ``source``: a tokenizer as it is, a TransformerBridge's or a BridgedModel's
    own, or a saved model directory's (``AutoTokenizer``). A one-line ValueError where there is none."""
    if is_tokenizer(source):
        return source
    if isinstance(source, str | Path):
        path = Path(source)
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(path))
        except Exception as err:  # no tokenizer files, or unreadable ones: one line either way
            first = (str(err).splitlines() or [type(err).__name__])[0][:160]
            raise ValueError(
                f"{path}: the model has no tokenizer that loads ({first}); save one beside it "
                "(tokenizer.save_pretrained) or pass a tokenizer"
            ) from None
    inner = getattr(source, "bridge", source)  # a BridgedModel wraps a bridge
    tok = getattr(inner, "tokenizer", None)
    if tok is None or not is_tokenizer(tok):
        raise ValueError(
            f"the model ({type(source).__name__}) has no tokenizer: boot it with one "
            "(pe_interp.models.bridge.hf_arch.boot_bridge(dir)) or pass the tokenizer itself"
        )
    return tok


def hf_config(source: Any) -> Any:
    """The Hugging Face config of ``source`` (a config, a model, a bridge, a BridgedModel or a saved
    directory, read as a namespace), or None where it has none."""
    if isinstance(source, str | Path):
        path = Path(source) / "config.json"
        if not path.is_file():
            return None
        from types import SimpleNamespace

        return SimpleNamespace(**json.loads(path.read_text()))
    if _is_config(source) and not callable(source):
        text = getattr(source, "get_text_config", None)
        return text() if callable(text) else source
    inner = getattr(source, "bridge", source)  # a BridgedModel wraps a bridge, a bridge a model
    inner = getattr(inner, "original_model", inner)
    cfg = getattr(inner, "config", None)
    text = getattr(cfg, "get_text_config", None)  # a composite config: its language model's part
    cfg = text() if callable(text) else cfg
    return cfg if cfg is not None and _is_config(cfg) else None


def _is_config(obj: Any) -> bool:
    names = ("vocab_size", "sliding_window", *CONTEXT_FIELDS)
    return any(hasattr(obj, name) for name in names)


def context_limit(source: Any) -> tuple[int | None, str]:
    """The longest prompt ``source`` (see :func:`hf_config`) attends over in full, and what sets it:
    ``(n, "context (max_position_embeddings)")``, ``(w, "sliding window")`` where a sliding window
    is on and shorter, or ``(None, "")`` where the config names no limit (ALiBi models)."""
    cfg = hf_config(source)
    if cfg is None:
        return None, ""
    limit: tuple[int | None, str] = (None, "")
    for name in CONTEXT_FIELDS:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            limit = (value, f"context ({name})")
            break
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    window_on = getattr(cfg, "use_sliding_window", True) is not False
    if layer_types is not None:
        window_on = window_on and any("sliding" in str(t) for t in layer_types)
    shorter = isinstance(window, int) and window > 0 and (limit[0] is None or window < limit[0])
    if shorter and window_on:
        limit = (window, "sliding window (sliding_window)")
    return limit


def model_vocab_size(source: Any) -> int | None:
    """The model's vocabulary size (``vocab_size`` of its config; a bridge's ``cfg.d_vocab``), or None."""
    d_vocab = getattr(getattr(getattr(source, "bridge", source), "cfg", None), "d_vocab", None)
    if isinstance(d_vocab, int):
        return d_vocab
    cfg = hf_config(source)
    value = getattr(cfg, "vocab_size", None) if cfg is not None else None
    return value if isinstance(value, int) else None


def bos_policy(tokenizer: Any, bos: bool | str = "auto") -> BosPolicy:
    """The BOS policy for ``tokenizer``: ``"auto"`` prepends its ``bos_token_id`` where it has one,
    ``True`` insists on it (one-line ValueError without), ``False`` prepends nothing."""
    if bos not in ("auto", True, False):
        raise ValueError(f"bos must be 'auto', True or False, got {bos!r}")
    bos_id = getattr(tokenizer, "bos_token_id", None)
    token = getattr(tokenizer, "bos_token", None)
    if bos is False:
        return BosPolicy(False, None, None, "off")
    if bos_id is None:
        if bos is True:
            raise ValueError("bos=True, but the tokenizer has no BOS token (bos_token_id is None)")
        return BosPolicy(False, None, None, "tokenizer has none")
    return BosPolicy(
        True,
        int(bos_id),
        None if token is None else str(token),
        "auto" if bos == "auto" else "asked",
    )


def pad_choice(tokenizer: Any, rows: list[list[int]]) -> tuple[int, str]:
    """``(pad id, where it came from)``: the tokenizer's pad token; without one, its EOS when no row
    holds it, else the lowest id no row holds (a pad id must never be a real token: the probes
    tell pads by it). A one-line ValueError when the tokenizer's own pad id is in a row."""
    used = {t for row in rows for t in row}
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        if int(pad) in used:
            raise ValueError(
                f"a prompt holds the tokenizer's pad token (id {pad}); pads could not be told "
                "from it: remove it from the prompt"
            )
        return int(pad), "the tokenizer's pad token"
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and int(eos) not in used:
        return int(eos), "EOS (the tokenizer has no pad token)"
    free = next(i for i in range(len(used) + 1) if i not in used)
    return free, "the lowest id in no prompt (the tokenizer has no pad token)"


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text`` as token ids, without special tokens."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def single_token(tokenizer: Any, word: str) -> int | None:
    """The id of ``word`` as one token with its leading space (``" dog"``; or ``"dog"`` where the
    tokenizer marks word starts itself, as SentencePiece does), None when it is not one token."""
    specials = set(tokenizer.all_special_ids)
    unk = getattr(tokenizer, "unk_token_id", None)
    for text in (" " + word, word):
        ids = encode(tokenizer, text)
        one = len(ids) == 1 and ids[0] not in specials and ids[0] != unk
        if one and tokenizer.decode(ids).strip() == word:
            return ids[0]
    return None


def word_pool(tokenizer: Any, words: tuple[str, ...] = COMMON_WORDS) -> list[int]:
    """The ids of ``words`` that are single tokens (:func:`single_token`), distinct, in list order."""
    out: list[int] = []
    for word in words:
        tid = single_token(tokenizer, word)
        if tid is not None and tid not in out:
            out.append(tid)
    return out


def id_pool(tokenizer: Any, vocab_size: int | None = None) -> list[int]:
    """Every token id of the base vocabulary (``tokenizer.vocab_size``, or ``vocab_size`` where
    smaller) except the special tokens (BOS, EOS, pad, unknown, and the rest)."""
    size = int(getattr(tokenizer, "vocab_size", None) or len(tokenizer))
    size = min(size, vocab_size) if vocab_size else size
    special = set(tokenizer.all_special_ids)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            special.add(int(value))
    return [i for i in range(size) if i not in special]


__all__ = [
    "BosPolicy",
    "bos_policy",
    "context_limit",
    "encode",
    "hf_config",
    "id_pool",
    "model_vocab_size",
    "pad_choice",
    "resolve_tokenizer",
    "single_token",
    "word_pool",
]

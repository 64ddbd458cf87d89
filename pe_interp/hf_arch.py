"""The paper's encodings as real architectures: a Hugging Face causal language model built from
a config at a given shape (``gpt2``: learned absolute positions; ``gpt-neox``: partial rotary, as
in Pythia; ``llama``: RoPE; ``bloom``: ALiBi), a word-level tokenizer for a task's ids, and the
directory both are saved to, which ``TransformerBridge.boot_transformers`` boots offline.

Nothing here downloads: every model is built from its config with seeded random weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHS = ("gpt2", "gpt-neox", "llama", "bloom")
PAD, UNK = "[PAD]", "[UNK]"


def hf_config(arch: str, *, n_layers: int, d_model: int, n_heads: int, d_mlp: int, n_ctx: int, d_vocab: int,
              pad_id: int, rotary_pct: float = 0.25) -> Any:  # fmt: skip
    """The ``transformers`` config of ``arch`` at this shape (no dropout; no BOS/EOS token)."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    if d_model % n_heads:
        raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
    common = {"vocab_size": d_vocab, "pad_token_id": pad_id, "bos_token_id": None, "eos_token_id": None}
    if arch == "gpt2":
        return transformers.GPT2Config(n_positions=n_ctx, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
                                       n_inner=d_mlp, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)  # fmt: skip
    if arch == "gpt-neox":
        return transformers.GPTNeoXConfig(max_position_embeddings=n_ctx, hidden_size=d_model, num_hidden_layers=n_layers,
                                          num_attention_heads=n_heads, intermediate_size=d_mlp, rotary_pct=rotary_pct,
                                          attention_dropout=0.0, hidden_dropout=0.0, **common)  # fmt: skip
    if arch == "llama":
        return transformers.LlamaConfig(max_position_embeddings=n_ctx, hidden_size=d_model, num_hidden_layers=n_layers,
                                        num_attention_heads=n_heads, num_key_value_heads=n_heads, intermediate_size=d_mlp,
                                        **common)  # fmt: skip
    return transformers.BloomConfig(hidden_size=d_model, n_layer=n_layers, n_head=n_heads, hidden_dropout=0.0,
                                    attention_dropout=0.0, **common)  # fmt: skip


def build_hf_model(arch: str, *, seed: int = 0, **shape: Any) -> Any:
    """A causal LM of ``arch`` (:func:`hf_config`) with seeded random weights, in eval mode."""
    import transformers

    cfg = hf_config(arch, **shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.eval()


def word_tokenizer(d_vocab: int, pad_id: int) -> Any:
    """A word-level tokenizer whose token ``i`` is the word ``t{i}`` (the pad id is ``[PAD]``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {(PAD if i == pad_id else f"t{i}"): i for i in range(d_vocab)}
    unk = UNK if UNK in vocab else PAD
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=unk)


def save_model_dir(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """``save_pretrained`` of the model and its tokenizer into ``out``."""
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def boot_bridge(model_dir: str | Path, device: str = "cpu") -> Any:
    """``TransformerBridge.boot_transformers`` of a saved directory, offline, with its own tokenizer."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: not a saved Hugging Face model (no config.json)")
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # one line per error on the command line, no loading bars
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        bridge = TransformerBridge.boot_transformers(str(model_dir), tokenizer=tokenizer, device=device)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    return bridge.eval()


__all__ = ["ARCHS", "boot_bridge", "build_hf_model", "hf_config", "save_model_dir", "word_tokenizer"]

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
from torch import Tensor, nn

from pe_interp.config.model import ARCH_ENCODINGS

ARCHS = tuple(ARCH_ENCODINGS)
PAD, UNK = "[PAD]", "[UNK]"


def hf_config(
    arch: str,
    *,
    n_layers: int,
    d_model: int,
    n_heads: int,
    d_mlp: int,
    n_ctx: int,
    d_vocab: int,
    pad_id: int,
    rotary_pct: float = 0.25,
    n_kv_heads: int | None = None,
) -> Any:
    """The ``transformers`` config of ``arch`` at this shape (no dropout; no BOS/EOS token; untied
    embeddings). ``n_kv_heads``: key/value heads shared by groups of query heads (grouped-query or,
    with 1, multi-query attention; None: one per query head), where ``arch`` has them (llama)."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    if d_model % n_heads:
        raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv_heads} key/value heads evenly")
    if n_kv_heads != n_heads and arch != "llama":
        raise ValueError(f"{arch} has one key/value head per query head (n_kv_heads: llama only)")
    # untied input and output embeddings in every architecture (GPT-2 and BLOOM tie them by default):
    # the run's weights are then plain tensors, and the answer tokens' readout is its own
    common = {
        "vocab_size": d_vocab,
        "pad_token_id": pad_id,
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": False,
    }
    if arch == "gpt2":
        return transformers.GPT2Config(
            n_positions=n_ctx,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            n_inner=d_mlp,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    if arch == "gpt-neox":
        return transformers.GPTNeoXConfig(
            max_position_embeddings=n_ctx,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=d_mlp,
            rotary_pct=rotary_pct,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            **common,
        )
    if arch == "llama":
        return transformers.LlamaConfig(
            max_position_embeddings=n_ctx,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_kv_heads,
            intermediate_size=d_mlp,
            **common,
        )
    return transformers.BloomConfig(
        hidden_size=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **common,
    )


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
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError, TypeError) as err:  # no tokenizer files, or none that load
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(
                f"{model_dir}: the model has no tokenizer that loads here ({first.rstrip(': ')}); "
                "save it with tokenizer.save_pretrained(dir)"
            ) from None
        bridge = TransformerBridge.boot_transformers(
            str(model_dir), tokenizer=tokenizer, device=device
        )
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    return bridge.eval()


def read_answers(logits: Tensor, mask: Tensor | None, answers: Tensor | None) -> Tensor:
    """The language-model form read as a classifier: each row's logits at its last real token
    (right padding: the real tokens are a prefix; ``mask`` None: no pads), at the ``answers``
    token ids (None: every token), ``[batch, n_classes]``."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    last = torch.full_like(rows, logits.shape[1] - 1) if mask is None else mask.sum(1) - 1
    out = logits[rows, last]
    return out if answers is None else out[:, answers]


class ArchClassifier(nn.Module):
    """A Hugging Face causal LM trained on a task in language-model form: what ``pe-interp train
    --arch`` trains (``ModelConfig.arch``). Class ``c`` is token ``cfg.d_vocab + c``; the model's
    vocabulary is the task's ids plus the answers; the shape is the config's."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg
        d_mlp = 4 * cfg.d_model if cfg.d_mlp is None else cfg.d_mlp
        self.hf = build_hf_model(
            cfg.arch,
            seed=cfg.seed,
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_mlp=d_mlp,
            n_ctx=cfg.n_ctx,
            d_vocab=cfg.d_vocab + cfg.n_classes,
            pad_id=cfg.pad_id,
        )
        self.register_buffer(
            "answers", torch.arange(cfg.d_vocab, cfg.d_vocab + cfg.n_classes), persistent=False
        )

    @property
    def W_E(self) -> Tensor:
        return self.hf.get_input_embeddings().weight

    def forward(self, tokens: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        mask = tokens != self.cfg.pad_id if pad_mask is None else pad_mask
        logits = self.hf(input_ids=tokens, attention_mask=mask.long()).logits
        return read_answers(logits, mask, self.answers)

    def save_dir(self, out: str | Path, weights: bool = True) -> Path:
        """``out`` as a saved Hugging Face model: its config and tokenizer, and (``weights``) its weights."""
        from transformers.utils import logging as hf_logging

        out = Path(out)
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            (self.hf if weights else self.hf.config).save_pretrained(out)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        word_tokenizer(self.cfg.d_vocab + self.cfg.n_classes, self.cfg.pad_id).save_pretrained(out)
        return out


def bridged(model: ArchClassifier, config_dir: str | Path, device: str = "cpu") -> Any:
    """A :class:`~pe_interp.models.bridge.model.BridgedModel`-ready ``TransformerBridge`` over ``model.hf``
    itself (shared weights), its config and tokenizer read from ``config_dir``."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(config_dir))
        bridge = TransformerBridge.boot_transformers(
            str(config_dir), tokenizer=tokenizer, hf_model=model.hf, device=device
        )
    finally:
        hf_logging.set_verbosity(level)
    return bridge.eval()


__all__ = [
    "ARCHS",
    "ArchClassifier",
    "boot_bridge",
    "bridged",
    "build_hf_model",
    "hf_config",
    "read_answers",
    "save_model_dir",
    "word_tokenizer",
]

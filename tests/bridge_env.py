"""Small bridges for the tests: a Hugging Face model of one architecture built from a config,
its attention sharpened so that positions matter, saved next to a word-level tokenizer and booted
offline as a TransformerLens bridge."""

from __future__ import annotations

from pathlib import Path

import torch

from pe_interp.models.bridge.hf_arch import (
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel


def sharp_bridge(
    arch: str,
    shape: dict,
    seed: int,
    sharpen: float,
    out: Path,
    answers: list[int],
    bias_noise: float = 0.0,
) -> tuple[object, BridgedModel, Path]:
    """``(hf, BridgedModel, saved directory)``: the query/key (and learned position) weights times
    ``sharpen``; every bias plus ``bias_noise`` times a normal draw (0: as initialised)."""
    hf = build_hf_model(arch, seed=seed, **shape)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "query_key_value", "c_attn", "wpe")):
                p.mul_(sharpen)
            if bias_noise and name.endswith("bias"):
                p.add_(bias_noise * torch.randn_like(p))
    saved = save_model_dir(hf, word_tokenizer(shape["d_vocab"], shape["pad_id"]), out)
    return hf, BridgedModel(boot_bridge(saved), answers=answers), saved

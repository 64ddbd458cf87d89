"""A causal intervention on positions (issue 47, item 4c): shifting every position by a constant
leaves a RoPE model's logits unchanged (RoPE is relative: a pair's term depends on ``m - n`` only),
and changes those of a model with absolute positions, so the check can fail.

- Hugging Face Llama (RoPE) and GPT-2 (learned absolute positions), built from small configs and
  called with ``position_ids = arange(n) + c``;
- our own :class:`~pe_interp.HookedPETransformer`, which takes no position offset: its encoding's
  tables are the seam (the RoPE module's ``cos``/``sin``, the sinusoidal ``table``), replaced by the
  tables of positions ``c, c + 1, ...`` computed in float64.

Tolerances. Hugging Face computes the rotation angles ``position * theta`` in float32 whatever the
model's dtype (its rotary module casts to float32 with autocast off), so a float64 Llama still
carries an angle error of about ``2^-24`` relative (about 6e-5 rad at position 1,000): the logits
move by ~1e-7 at most here, hence 1e-6 in float64; in float32 every matmul adds rounding of about
``d * 2^-24`` of its inputs' size, hence 1e-5. Our model in float64 with float64 tables has only
float64 rounding (angles to ~1e-13 rad at position 1,000): 1e-9. Every control (an absolute model
shifted, or positions doubled instead of shifted) moves the logits by more than 1e-2 (Hugging Face's
language-model logits) or 1e-3 (our tiny classifier's class logits, 10^6 times its tolerance).
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from pe_interp.encodings.absolute import sinusoidal_table
from pe_interp.kernels.rope import rope_frequencies
from pe_interp.models.bridge.hf_arch import build_hf_model

SHAPE = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_mlp": 40, "n_ctx": 2048}
SHAPE |= {"d_vocab": 30, "pad_id": 0}
SHIFTS = (1, 7, 100, 1000)
N = 12


def _hf(arch: str, dtype: torch.dtype):
    shape = {**SHAPE, "n_kv_heads": 2} if arch == "llama" else SHAPE
    hf = build_hf_model(arch, seed=0, **shape).to(dtype)
    with torch.no_grad():  # sharper attention than the initialisation's: positions matter
        for name, p in hf.named_parameters():
            if any(s in name for s in ("q_proj", "k_proj", "c_attn")):
                p.mul_(8.0)
    return hf


def _logits(hf, tokens, positions):
    with torch.no_grad():
        return hf(tokens, position_ids=positions).logits


def _tokens(n: int = 3):
    return torch.randint(1, 30, (n, N), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_shifting_every_position_leaves_llamas_logits_unchanged(dtype, tol):
    hf, tokens = _hf("llama", dtype), _tokens()
    pos = torch.arange(N)[None].expand(len(tokens), -1)
    base = _logits(hf, tokens, pos)
    for c in SHIFTS:
        assert float((_logits(hf, tokens, pos + c) - base).abs().max()) <= tol, c
    # the control: positions doubled are not a shift, and the logits move
    assert float((_logits(hf, tokens, 2 * pos) - base).abs().max()) > 1e-2


def test_shifting_every_position_changes_an_absolute_models_logits():
    hf, tokens = _hf("gpt2", torch.float64), _tokens()
    pos = torch.arange(N)[None].expand(len(tokens), -1)
    base = _logits(hf, tokens, pos)
    for c in SHIFTS:
        assert float((_logits(hf, tokens, pos + c) - base).abs().max()) > 1e-2, c


def _shift_tables(model, c: int, scale: int = 1) -> None:
    """Our model's encoding tables at positions ``scale * (c, c + 1, ...)``, in float64."""
    pos = scale * torch.arange(c, c + model.cfg.n_ctx, dtype=torch.float64)
    for part in model.encoding.modules():
        if hasattr(part, "rotary_dim"):  # RoPE
            ang = pos[:, None] * rope_frequencies(part.rotary_dim, part.base)
            part.cos, part.sin = ang.cos(), ang.sin()
        if hasattr(part, "table"):  # sinusoidal: the absolute part
            d = model.cfg.d_model
            table = sinusoidal_table(int(pos[-1]) + 1, d, part.base, part.layout).double()
            part.table = table[pos.long()]


def _ours(encoding: str):
    model = tiny_model(encoding, double=True, attention_dir="causal", n_ctx=N)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.mul_(8.0)
            block.attn.W_K.mul_(8.0)
    return model


def test_our_rope_model_with_its_tables_shifted_gives_the_same_logits():
    model, tokens = _ours("rope"), _tokens(4) % 19 + 1
    _shift_tables(model, 0)
    with torch.no_grad():
        base = model(tokens)
        for c in SHIFTS:
            _shift_tables(model, c)
            assert float((model(tokens) - base).abs().max()) <= 1e-9, c
        _shift_tables(model, 0, scale=2)  # the control: positions doubled
        assert float((model(tokens) - base).abs().max()) > 1e-3


def test_our_sinusoidal_plus_rope_model_is_not_shift_invariant():
    """The authors' "rope" model adds sinusoidal absolute positions: shifting both its tables
    moves the logits; shifting its rotation alone does not."""
    model, tokens = _ours("sinusoidal+rope"), _tokens(4) % 19 + 1
    _shift_tables(model, 0)
    with torch.no_grad():
        base = model(tokens)
        _shift_tables(model, 7)
        assert float((model(tokens) - base).abs().max()) > 1e-3
        sinusoid = [p for p in model.encoding.modules() if hasattr(p, "table")][0]
        sinusoid.table = sinusoidal_table(N, model.cfg.d_model, sinusoid.base, sinusoid.layout)
        sinusoid.table = sinusoid.table.double()  # back at 0..n-1: the rotation alone is shifted
        assert float((model(tokens) - base).abs().max()) <= 1e-9

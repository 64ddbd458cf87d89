"""The fast path and the hooked path compute the same function; bf16 autocast is detected, used
only where it pays, within a stated tolerance of fp32, and resumes bit for bit.

The fast path is what a plain forward runs: SDPA attention, the fused LayerNorm and RoPE as one
complex multiply. The hooked path is what a forward with hooks runs: eager attention wherever a
score or pattern is hooked, the norm's scale materialised for its hook.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import ENCODINGS, TINY, smoke_trainer

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.kernels.rope import apply_rope, rope_angles
from pe_interp.util import hardware

# bf16 keeps 8 bits of mantissa: a relative error of 2^-8 per rounding. Through a 2-layer model the
# logits of a tiny random model stay within this of fp32 (measured: about 1e-2).
BF16_LOGIT_ATOL = 5e-2


def _tokens(n: int = 6, n_pos: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, TINY["d_vocab"], (n, n_pos), generator=gen)
    lengths = torch.tensor([12, 9, 5, 12, 3, 7])[:n]
    pad = torch.arange(n_pos)[None] < lengths[:, None]
    return tokens.masked_fill(~pad, 0), torch.randint(0, TINY["n_classes"], (n,), generator=gen)


def _identity_hooks(model) -> list:
    return [(name, lambda x, hook: None) for name in model.hook_dict]


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_fast_path_equals_hooked_path(encoding):
    cfg = ModelConfig(**TINY, encoding=ENCODINGS[encoding], init_std=0.3, attn_backend="sdpa")
    model = HookedPETransformer(cfg)
    tokens, labels = _tokens()

    def loss_and_grads(hooks):
        model.zero_grad()
        with model.hooks(fwd_hooks=hooks):
            logits = model(tokens)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    fast_logits, fast_grads = loss_and_grads([])
    hooked_logits, hooked_grads = loss_and_grads(_identity_hooks(model))
    assert model.blocks[0].attn.backend(model.context(tokens, tokens != 0, None)) == "sdpa"
    torch.testing.assert_close(hooked_logits, fast_logits, atol=1e-5, rtol=1e-5)
    for name in fast_grads:
        torch.testing.assert_close(
            hooked_grads[name], fast_grads[name], atol=1e-5, rtol=1e-4, msg=name
        )
    # A cached forward is not merely close: with only caching hooks it is the same numbers.
    cached, _ = model.run_with_cache(tokens)
    torch.testing.assert_close(
        cached, model.run_with_hooks(tokens, fwd_hooks=_identity_hooks(model)), atol=0, rtol=0
    )


def test_a_hook_that_replaces_the_scale_takes_the_explicit_norm():
    cfg = ModelConfig(**TINY, encoding="rope", init_std=0.3)
    model = HookedPETransformer(cfg)
    tokens, _ = _tokens()
    plain = model(tokens)
    same = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.ln1.hook_scale", lambda s, hook: s.clone())]
    )
    torch.testing.assert_close(same, plain, atol=1e-6, rtol=1e-6)  # same function, other kernel
    doubled = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.ln1.hook_scale", lambda s, hook: 2 * s)]
    )
    assert (doubled - plain).abs().max() > 1e-3  # the replaced scale is really used


@pytest.mark.parametrize(
    "start, dim, heads_first", [(0, 8, False), (0, 4, False), (4, 4, False), (2, 4, True)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_complex_rope_is_the_two_real_rotation(start, dim, heads_first, dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 4, 8, generator=gen, dtype=dtype)
    x = x.transpose(1, 2).contiguous() if heads_first else x
    cos, sin = rope_angles(6, dim, 10000.0)
    mask = torch.tensor([True, False, True, True])
    got = apply_rope(x, cos, sin, start, mask, heads_first=heads_first)
    # The formula in float64, pair by pair.
    c = cos[:5].double()
    s = sin[:5].double()
    c, s = (c[None, :, :], s[None, :, :]) if heads_first else (c[:, None, :], s[:, None, :])
    ref = x.double().clone()
    x1, x2 = (
        ref[..., start : start + dim : 2].clone(),
        ref[..., start + 1 : start + dim : 2].clone(),
    )
    rot = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)
    keep = mask[:, None, None] if heads_first else mask[:, None]
    ref[..., start : start + dim] = torch.where(keep, rot, ref[..., start : start + dim])
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
    assert got.dtype == dtype
    # bf16 input: rotated in fp32 and rounded once, so exactly the fp32 rotation of the bf16
    # values, rounded; the two-real form in bf16 arithmetic (an explicit compute_dtype) is
    # within bf16 rounding of it.
    xb = x.bfloat16()
    half = apply_rope(xb, cos, sin, start, mask, heads_first=heads_first)
    assert half.dtype == torch.bfloat16
    want = apply_rope(xb.float(), cos, sin, start, mask, heads_first=heads_first).bfloat16()
    assert torch.equal(half, want)
    torch.testing.assert_close(half.double(), ref, atol=0.05, rtol=0.02)
    two_real = apply_rope(
        xb, cos, sin, start, mask, heads_first=heads_first, compute_dtype=torch.bfloat16
    )
    assert two_real.dtype == torch.bfloat16
    torch.testing.assert_close(two_real.double(), half.double(), atol=0.05, rtol=0.02)


# ---- bf16 ---------------------------------------------------------------------------------------
def test_cpu_bf16_detection_and_override(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.delenv(hardware.ENV_OVERRIDE, raising=False)
    assert not hardware.cpu_has_bf16()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert hardware.cpu_has_bf16()
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "0")
    assert not hardware.cpu_has_bf16()
    with hardware.autocast("cpu", amp=True):
        assert not torch.is_autocast_enabled("cpu")
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "1")
    with hardware.autocast("cpu", amp=True):
        assert (
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
    with hardware.autocast("cpu", amp=False):
        assert not torch.is_autocast_enabled("cpu")


def test_this_machine_reads_real_flags():
    flags = hardware.cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags here")
    assert hardware.cpu_has_bf16() is False  # conftest pins fp32 for the suite
    os.environ.pop(hardware.ENV_OVERRIDE)
    try:
        assert hardware.cpu_has_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})
    finally:
        os.environ[hardware.ENV_OVERRIDE] = "0"


@pytest.mark.parametrize("encoding", ["rope", "t5", "decoupled_rope", "sinusoidal+rope"])
def test_bf16_logits_within_tolerance_of_fp32(encoding, monkeypatch):
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "1")
    model = HookedPETransformer(ModelConfig(**TINY, encoding=encoding, init_std=0.1))
    tokens, _ = _tokens()
    seen = []
    record = [("blocks.0.attn.hook_q", lambda q, hook: seen.append(q.dtype))]
    with torch.no_grad():
        fp32 = model(tokens)
        with hardware.autocast("cpu", amp=True), model.hooks(fwd_hooks=record):
            bf16 = model(tokens)
    assert seen == [torch.bfloat16]  # the projections really ran in bf16
    err = (bf16.float() - fp32).abs().max().item()
    assert 0 < err <= BF16_LOGIT_ATOL
    assert math.isfinite(err)


def test_bf16_training_resumes_bit_for_bit(tmp_path, monkeypatch):
    """Killed after its first checkpoint and resumed, a bf16-autocast run reaches the weights of an
    uninterrupted bf16 run exactly (and they differ from an fp32 run's)."""
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "1")
    run = smoke_trainer(crash_at=5)

    ref = run(tmp_path / "ref")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", crash=True)
    resumed = run(tmp_path / "killed", resume=True)
    assert all(torch.equal(ref[k], resumed[k]) for k in ref)
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "0")
    fp32 = run(tmp_path / "fp32")
    assert any(not torch.equal(ref[k], fp32[k]) for k in ref)


def test_probes_in_bf16_stay_within_the_stated_tolerance(monkeypatch):
    """ablate_heads(amp=True) and patch(amp=True): within the 2-point tolerance of fp32 stated in
    benchmarks/RESULTS.md, on a small trained model (and really computed in bf16: the numbers are
    not identical)."""
    from pe_interp.api import train
    from pe_interp.config.presets import build_run_configs
    from probes import ablate_heads, patch

    model = train(
        task="distance", encoding="rope", preset="smoke", seed=0, progress=False, epochs=6, lr=1e-2
    ).model.eval()
    _, task, _ = build_run_configs("distance", "rope", "smoke", 0)
    test = task.sample(300, seed=3)
    fp32 = ablate_heads(
        model, test.tokens, test.labels, pad_mask=test.pad_mask, metric="logit", n_bootstrap=0
    )
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "1")
    bf16 = ablate_heads(
        model,
        test.tokens,
        test.labels,
        pad_mask=test.pad_mask,
        metric="logit",
        n_bootstrap=0,
        amp=True,
    )
    assert not (bf16.values == fp32.values).all()
    scale = abs(fp32.baseline)
    assert abs(bf16.drops - fp32.drops).max() <= 0.05 * (1 + scale)
    acc32 = ablate_heads(model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=0)
    acc16 = ablate_heads(
        model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=0, amp=True
    )
    assert abs(acc16.drops - acc32.drops).max() <= 0.02
    pairs = task.counterfactual_pairs(64, seed=1)
    kw = dict(
        site="z",
        pad_mask=pairs.clean.pad_mask,
        clean_labels=pairs.clean.labels,
        corrupt_labels=pairs.corrupt.labels,
        n_bootstrap=0,
    )
    p16 = patch(model, pairs.clean.tokens, pairs.corrupt.tokens, amp=True, **kw)
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "0")
    p32 = patch(model, pairs.clean.tokens, pairs.corrupt.tokens, **kw)
    assert abs(p16.values - p32.values).max() <= 0.1

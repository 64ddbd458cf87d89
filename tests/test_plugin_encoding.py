"""A user's encoding, registered outside the package, works with every probe without probe edits:
ablation (batched = naive), patching (= TransformerLens), logit terms (sum to the logits, with
per-frequency terms from the spans the encoding describes) and per-head gradients (which find
its per-head parameter through ``head_parameters``). Probes never look at an encoding's class."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from conftest import tiny_model
from torch import nn
from transformer_lens import patching as tlp

from pe_interp import HookedPETransformer, register_encoding
from pe_interp.encodings import Encoding, HeadAxes, RotarySpan
from pe_interp.encodings.spec import _REGISTRY
from pe_interp.kernels.rope import apply_rope, rope_angles, rope_frequencies
from probes import (
    ablate_heads,
    ablate_heads_naive,
    logit_terms,
    normalized_logit_diff_metric,
    patch,
)
from probes.gradients.coherence import head_gradient_stats, head_slices, per_example_grads

VOCAB, POS, N, CLASSES = 24, 8, 6, 4


class HalfRotaryBias(Encoding):
    """Hybrid: rotates the second half of every head's q/k dims by position (its own base), and adds
    a learned per-layer, per-head bias for "key after query"."""

    kind = "hybrid"

    def __init__(self, cfg, base: float = 50.0):
        super().__init__(cfg)
        self.base, self.half = base, cfg.d_head // 2
        cos, sin = rope_angles(cfg.n_ctx, self.half, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.after = nn.Parameter(torch.empty(cfg.n_heads, cfg.n_layers))  # [head, layer]
        pos = torch.arange(cfg.n_ctx)
        self.register_buffer("later", (pos[None, :] > pos[:, None]).float(), persistent=False)

    def rotate(self, q, k, layer):
        return apply_rope(q, self.cos, self.sin, self.half), apply_rope(
            k, self.cos, self.sin, self.half
        )

    def bias(self, n_q, n_k, layer):
        return self.after[:, layer, None, None] * self.later[:n_q, :n_k]

    def rotary_spans(self, layer):
        return (
            RotarySpan(
                self.half, self.half, rope_frequencies(self.half, self.base), self.cos, self.sin
            ),
        )

    def head_parameters(self):
        return {"after": HeadAxes(head=0, layer=1)}


class SilentRotation(HalfRotaryBias):
    """The same, without describing its rotation: probes still work, without per-frequency terms."""

    def rotary_spans(self, layer):
        return None


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_encoding("test_half_rotary_bias")(HalfRotaryBias)
    register_encoding("test_silent_rotation")(SilentRotation)
    yield
    for name in ("test_half_rotary_bias", "test_silent_rotation"):
        _REGISTRY.pop(name, None)


def make_model(encoding="test_half_rotary_bias", **kw) -> HookedPETransformer:
    """The tiny model at this file's vocabulary and classes, init_std 0.4, seed 5, in float64."""
    cfg = dict(d_vocab=VOCAB, n_classes=CLASSES, init_std=0.4, seed=5)
    return tiny_model(encoding, double=True, **{**cfg, **kw})


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 7, 8, 5, 6, 8])
    pad = torch.arange(POS)[None] < lengths[:, None]
    tokens = torch.randint(1, VOCAB, (N, POS), generator=g) * pad
    return tokens, torch.randint(0, CLASSES, (N,), generator=g), pad


def test_the_model_uses_the_plug_in():
    model = make_model()
    assert (
        model.cfg.encoding_kind == "hybrid" and model.encoding.rotates and model.encoding.has_bias
    )
    assert (
        model.cfg.attn_backend == "auto" and model.encoding.fused(0, POS) is None
    )  # not fusible: SDPA


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_ablation_batched_equals_naive(method):
    model = make_model()
    tokens, labels, pad = batch()
    kw = dict(pad_mask=pad, method=method, metric="logit", n_bootstrap=20, batch_size=7)
    fast = ablate_heads(model, tokens, labels, **kw)
    slow = ablate_heads_naive(model, tokens, labels, **kw)
    np.testing.assert_allclose(fast.values, slow.values, atol=1e-10, rtol=0)
    np.testing.assert_allclose(fast.ci_low, slow.ci_low, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    ("site", "fn"),
    [
        ("z", tlp.get_act_patch_attn_head_out_all_pos),
        ("q", tlp.get_act_patch_attn_head_q_all_pos),
        ("attn_out", tlp.get_act_patch_attn_out),
        ("mlp_out", tlp.get_act_patch_mlp_out),
    ],
)
def test_patching_equals_transformer_lens(site, fn):
    model = make_model()
    clean, labels, _ = batch(1)
    corrupt = clean.clone()
    corrupt[:, 2] = (corrupt[:, 2] % (VOCAB - 1)) + 1
    corrupt[:, 4] = (corrupt[:, 4] + 3) % (VOCAB - 1) + 1
    corrupt = corrupt * (clean != 0)
    other = (labels + 1) % CLASSES
    with torch.no_grad():
        metric = normalized_logit_diff_metric(model(clean), model(corrupt), labels, other)
        _, cache = model.run_with_cache(clean)
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm
            expected = fn(model, corrupt, cache, metric)
    got = patch(
        model, clean, corrupt, site=site, clean_labels=labels, corrupt_labels=other, n_bootstrap=0
    )
    torch.testing.assert_close(got.values, expected.to(got.values.dtype), atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("layer", [0, 1])
def test_logit_terms_sum_to_the_logits_with_the_described_frequencies(layer):
    model = make_model()
    tokens, _, pad = batch(2)
    for head in range(2):
        t = logit_terms(model, tokens, layer, head, pad_mask=pad, example=3)
        assert float((t.total - t.actual).abs().max()) < 1e-8  # the terms sum to the model's logits
        assert t.check() < 1e-5  # the Hadamard form, un-rotating with the float32 cos/sin tables
        assert "relative_bias" in t.terms
        assert t.rope is not None and t.rope.n_pairs == 2  # d_head 8: dims 4..7, two pairs
        torch.testing.assert_close(
            t.rope.theta, 50.0 ** (-torch.arange(0, 4, 2, dtype=torch.float64) / 4)
        )
        assert t.rope.unrotated.abs().max() > 0  # the first half is not rotated
    silent = logit_terms(make_model("test_silent_rotation"), tokens, layer, 0, pad_mask=pad)
    assert silent.rope is None and silent.check() < 1e-8


def test_per_head_gradients_find_the_plug_in_parameter():
    model = make_model()
    tokens, labels, pad = batch(3)
    names = [s.name for s in head_slices(model)]
    assert "encoding.after" in names
    a = per_example_grads(model, tokens, labels, pad, names, method="vmap")
    b = per_example_grads(model, tokens, labels, pad, names, method="loop")
    for k in names:
        torch.testing.assert_close(a[k], b[k], atol=1e-10, rtol=1e-7)
    assert float(a["encoding.after"].abs().max()) > 0
    coh, _, _ = head_gradient_stats(model, tokens, labels, pad, params=("encoding",))
    assert coh.shape == (2, 2) and torch.isfinite(coh).all()

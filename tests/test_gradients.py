"""Gradient coherence: the statistic, vmap vs loop per-example gradients, and known answers."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from pe_interp import HookedPETransformer, ModelConfig
from probes.gradients.coherence import (
    coherence,
    coherence_report,
    format_coherence_report,
    gradient_coherence,
    head_gradient_stats,
    head_slices,
    per_example_grads,
)

VOCAB, POS = 30, 8


def make_model(encoding="rope", n_classes=4, **kw) -> HookedPETransformer:
    """The tiny model with d_mlp 16, this file's vocabulary, init_std 0.3, seed 0, in float64."""
    cfg = dict(d_mlp=16, d_vocab=VOCAB, init_std=0.3, seed=0)
    return tiny_model(encoding, double=True, n_classes=n_classes, **{**cfg, **kw})


def make_batch(n=5, n_classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (n, POS), generator=g)
    tokens[: n // 2, 6:] = 0
    return tokens, torch.randint(0, n_classes, (n,), generator=g), tokens != 0


def test_coherence_statistic():
    g = torch.tensor([3.0, -1.0, 2.0])
    assert float(coherence(torch.stack([g, g, g]))) == pytest.approx(1.0)
    assert float(coherence(torch.stack([g, -g]))) == pytest.approx(0.0, abs=1e-15)
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    # ||(a + b) / 2|| / ((||a|| + ||b||) / 2) = sqrt(5)/2 / (3/2)
    assert float(coherence(torch.stack([a, b]))) == pytest.approx(math.sqrt(5) / 3)
    assert math.isnan(float(coherence(torch.zeros(2, 3))))
    batched = coherence(torch.stack([torch.stack([g, g]), torch.stack([g, -g])]))
    assert (
        batched.shape == (2,)
        and batched[0] == pytest.approx(1.0)
        and batched[1] == pytest.approx(0.0)
    )


@pytest.mark.parametrize("encoding", ["rope", "t5", "decoupled_rope", "sinusoidal", "alibi"])
def test_vmap_equals_loop(encoding):
    model = make_model(encoding)
    tokens, labels, pad = make_batch()
    names = [s.name for s in head_slices(model)]
    a = per_example_grads(model, tokens, labels, pad, names, method="vmap")
    b = per_example_grads(model, tokens, labels, pad, names, method="loop")
    assert set(a) == set(b) == set(names)
    for k in names:
        assert a[k].shape == (5, *dict(model.named_parameters())[k].shape)
        torch.testing.assert_close(a[k], b[k], atol=1e-10, rtol=1e-7)
    assert max(float(v.abs().max()) for v in a.values()) > 1e-4
    ca = head_gradient_stats(model, tokens, labels, pad, chunk_size=2, method="vmap")
    cb = head_gradient_stats(model, tokens, labels, pad, method="loop")
    for x, y in zip(ca, cb):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-8)


def test_head_slices_match_manual_concatenation():
    model = make_model("t5")
    tokens, labels, pad = make_batch()
    names = [s.name for s in head_slices(model)]
    assert "encoding.rel_bias" in names and "blocks.1.attn.W_O" in names
    grads = per_example_grads(model, tokens, labels, pad, names, method="loop")
    coh, norm_of_mean, mean_norm = head_gradient_stats(model, tokens, labels, pad)
    for layer in range(2):
        for h in range(2):
            parts = [
                grads[f"blocks.{layer}.attn.{p}"][:, h].flatten(1)
                for p in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")
            ]
            parts.append(grads["encoding.rel_bias"][:, layer, h])
            vec = torch.cat(parts, dim=1)
            assert float(coh[layer, h]) == pytest.approx(float(coherence(vec)), rel=1e-10)
            assert float(mean_norm[layer, h]) == pytest.approx(
                float(vec.norm(dim=1).mean()), rel=1e-10
            )
            assert float(norm_of_mean[layer, h]) == pytest.approx(
                float(vec.mean(0).norm()), rel=1e-10
            )


def test_identical_examples_are_fully_coherent():
    model = make_model("alibi")
    tokens, labels, pad = make_batch(1)
    batch = (tokens.repeat(4, 1), labels.repeat(4), pad.repeat(4, 1))
    r = gradient_coherence(model, batch)
    torch.testing.assert_close(r.values, torch.ones(1, 2, 2), atol=1e-6, rtol=0)


def test_two_class_known_answer():
    """Same tokens, labels 0 and 1, two classes: g_1 = -(p_0 / p_1) g_0 exactly, so the coherence
    of every head is |p_0 - p_1| (derived by hand from the softmax cross-entropy gradient)."""
    model = make_model("rope", n_classes=2)
    with torch.no_grad():
        model.b_U.copy_(torch.tensor([0.7, -0.4]))
    tokens, _, pad = make_batch(1, n_classes=2)
    batch = (tokens.repeat(2, 1), torch.tensor([0, 1]), pad.repeat(2, 1))
    with torch.no_grad():
        p = F.softmax(model(tokens), -1)[0]
    expected = abs(float(p[0] - p[1]))
    assert expected > 0.1
    r = gradient_coherence(model, batch)
    torch.testing.assert_close(r.values, torch.full((1, 2, 2), expected), atol=1e-6, rtol=0)
    # p_0 = p_1 (equal logits, via the unembedding bias): the two gradients cancel exactly
    with torch.no_grad():
        model.b_U.zero_()
        z = model(tokens)[0]
        model.b_U.copy_(torch.tensor([0.0, float(z[0] - z[1])]))
    r = gradient_coherence(model, batch)
    assert float(r.mean_norm.min()) > 1e-4  # the per-example gradients themselves are not small
    assert float(r.values.max()) < 1e-6


def test_seeds_config_and_report():
    cfg = ModelConfig(
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_mlp=16,
        n_ctx=12,
        d_vocab=VOCAB,
        n_classes=4,
        encoding="rope",
    )
    tokens, labels, pad = make_batch(6)
    r = gradient_coherence(cfg, (tokens, labels, pad), init_seeds=(0, 1))
    assert r.values.shape == (2, 2, 2) and r.seeds == (0, 1)
    assert r.mean.shape == (2, 2) and r.std.shape == (2, 2)
    # each init seed's values are those of a model built with that seed (the init_seeds plumbing)
    for i, seed in enumerate((0, 1)):
        one = gradient_coherence(HookedPETransformer(cfg.replace(seed=seed)), (tokens, labels, pad))
        torch.testing.assert_close(r.values[i], one.values[0], rtol=1e-9, atol=1e-12)
    assert not torch.equal(r.values[0], r.values[1])  # different initialisations
    again = gradient_coherence(cfg, (tokens, labels), init_seeds=(0, 1))  # pad mask from tokens
    torch.testing.assert_close(again.values, r.values)
    json.dumps(r.to_dict())
    rep = coherence_report(
        cfg,
        (tokens, labels, pad),
        encodings=("rope", "alibi", "t5", "sinusoidal"),
        init_seeds=(0, 1),
    )
    assert list(rep) == ["rope", "alibi", "t5", "sinusoidal"]
    text = format_coherence_report(rep)
    assert text.count("\n") == 4 * 2 + 1 and "alibi" in text
    qk = gradient_coherence(cfg, (tokens, labels), init_seeds=(0,), params=("W_Q", "W_K"))
    assert qk.params == ("W_Q", "W_K") and not torch.allclose(qk.values, r.values[:1])
    with pytest.raises(ValueError, match="params"):
        gradient_coherence(cfg, (tokens, labels), params=("W_X",))
    with pytest.raises(ValueError, match="labels"):
        gradient_coherence(cfg, (tokens, labels + 10))

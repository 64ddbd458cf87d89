"""Logit decomposition: terms sum to the model's logits; RoPE Hadamard form; Toeplitz and
positional scores."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import tiny_model

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.encodings import alibi_slopes
from probes.decomposition import logit_terms, positional_scores, toeplitz_score

VOCAB, POS = 40, 10


def make_model(encoding, seed=0, **kw) -> HookedPETransformer:
    """The tiny model with d_model 32, 4 heads, 16 positions, this file's vocabulary, init_std 0.2
    and ``seed``, in eval mode; its biases, LN weights and encoding tables then drawn non-zero."""
    cfg = dict(d_model=32, n_heads=4, n_ctx=16, d_vocab=VOCAB, n_classes=5, init_std=0.2, seed=seed)
    model = tiny_model(encoding, **{**cfg, **kw})
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-zero biases, LN parameters and encoding tables
        for name, p in model.named_parameters():
            if name.endswith(("b_Q", "b_K", "b_V", ".b")) or name.startswith("encoding."):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith(".w"):
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.2)
    return model


def make_tokens(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(1, VOCAB, (n, POS), generator=g)
    t[1, 7:] = 0  # a padded row
    return t


ENCODINGS = [
    "nope",
    "sinusoidal",
    "learned",
    "rope",
    "alibi",
    "t5",
    "sinusoidal+rope",
    "decoupled_rope",
    {"name": "rope", "rotary_dim": 4},
    {"name": "rope", "heads": [1, 2]},
    "learned+t5",
]


@pytest.mark.parametrize(
    "encoding", ENCODINGS, ids=lambda e: e if isinstance(e, str) else json.dumps(e)
)
def test_terms_sum_to_logits_every_encoding(encoding):
    model = make_model(encoding)
    tokens = make_tokens()
    for layer in (0, 1):
        for head in range(4):
            t = logit_terms(model, tokens, layer, head, example=1)
            assert t.check() < 1e-4, (layer, head, t.check())
            scores = model.run_with_cache(tokens[1:2])[1][f"blocks.{layer}.attn.hook_attn_scores"][
                0, head
            ]
            allowed = torch.isfinite(scores)
            torch.testing.assert_close(t.total[allowed], scores[allowed], atol=1e-4, rtol=0)
            assert t.valid.equal(allowed) and (~allowed).any()  # padding keys are masked
            assert t.actual.abs().max() > 0.1  # non-trivial logits
            if layer == 1:
                assert set(t.terms) <= {"qk", "relative_bias"}


@pytest.mark.parametrize(
    "kw",
    [
        dict(kv_source="embed"),
        dict(normalization_type="RMS", attention_dir="causal"),
        dict(normalization_type=None),
    ],
    ids=["kv-embed", "rms-causal", "no-norm"],
)
@pytest.mark.parametrize("encoding", ["sinusoidal+rope", "learned+t5", "alibi"])
def test_terms_sum_variants(encoding, kw):
    model = make_model(encoding, **kw)
    tokens = make_tokens()
    for head in range(4):
        t = logit_terms(model, tokens, 0, head, example=0)
        scale = max(1.0, float(t.actual.abs().max()))
        assert t.check() < 1e-4 * scale


def test_term_names_and_bias_values():
    tokens = make_tokens()
    t = logit_terms(make_model("sinusoidal"), tokens, 0, 0)
    assert t.components == ("content", "position", "offset")
    assert {"content-content", "content-position", "position-content", "position-position"} <= set(
        t.terms
    )
    assert "relative_bias" not in t.terms
    assert set(t.grouped()) == {
        "content-content",
        "content-position",
        "position-content",
        "position-position",
        "offset",
    }
    r = logit_terms(make_model("rope"), tokens, 0, 0)
    assert r.components == ("content", "offset") and "position-position" not in r.terms
    model = make_model("alibi")
    a = logit_terms(model, tokens, 0, 3)
    rel = (torch.arange(POS)[None] - torch.arange(POS)[:, None]).abs().float()
    torch.testing.assert_close(a.terms["relative_bias"], -alibi_slopes(4)[3] * rel)
    d = json.loads(json.dumps(a.to_dict(matrices=True)))
    assert d["max_error"] < 1e-4 and len(d["matrices"]["actual"]) == POS
    assert d["toeplitz"]["relative_bias"] == pytest.approx(1.0)


def test_position_terms_do_not_depend_on_tokens_without_norm():
    model = make_model("learned", normalization_type=None)
    tokens = make_tokens()
    a = logit_terms(model, tokens, 0, 2, example=0)
    b = logit_terms(model, tokens, 0, 2, example=2)
    torch.testing.assert_close(a.terms["position-position"], b.terms["position-position"])
    assert (a.terms["content-content"] - b.terms["content-content"]).abs().max() > 1e-3


def test_rope_hadamard_form():
    model = make_model({"name": "rope", "base": 100.0})
    tokens = make_tokens()
    t = logit_terms(model, tokens, 0, 1, example=0)
    rope = t.rope
    assert rope is not None and rope.n_pairs == 4  # d_head 8 -> 4 interleaved pairs
    torch.testing.assert_close(
        rope.theta, 100.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    )
    # G^(k) is the complex Gram of the un-rotated q and k (adjacent pairs)
    _, cache = model.run_with_cache(tokens[:1])
    q, k = (
        cache["blocks.0.attn.hook_q"][0, :, 1].double(),
        cache["blocks.0.attn.hook_k"][0, :, 1].double(),
    )
    zq, zk = torch.complex(q[:, 0::2], q[:, 1::2]), torch.complex(k[:, 0::2], k[:, 1::2])
    gram = torch.einsum("qp,kp->pqk", zq, zk.conj())
    torch.testing.assert_close(rope.gram, gram, atol=1e-5, rtol=1e-5)
    # E^(k): unit modulus, unit diagonal, Toeplitz, Hermitian, rank one
    E = rope.kernel
    torch.testing.assert_close(E.abs(), torch.ones_like(E.real))
    torch.testing.assert_close(E.diagonal(dim1=1, dim2=2), torch.ones(4, POS, dtype=E.dtype))
    torch.testing.assert_close(E[:, 1:, 1:], E[:, :-1, :-1])
    torch.testing.assert_close(E, E.conj().transpose(1, 2))
    assert (torch.linalg.matrix_rank(E) == 1).all()
    # L = Re sum_k G o E (scaled), per pair and in total
    torch.testing.assert_close(rope.hadamard().float(), rope.pair_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(rope.total, t.qk, atol=1e-5, rtol=0)
    assert rope.unrotated.abs().max() == 0
    assert rope.frequency_share().sum() == pytest.approx(1.0)
    # partial rotation keeps the rest in `unrotated`
    p = logit_terms(make_model({"name": "rope", "rotary_dim": 4}), tokens, 1, 0)
    assert p.rope.n_pairs == 2 and p.rope.unrotated.abs().max() > 0 and p.check() < 1e-4
    # a head RoPE skips has no rotary terms
    assert logit_terms(make_model({"name": "rope", "heads": [1]}), tokens, 0, 0).rope is None


def test_toeplitz_score():
    n = 12
    rel = (torch.arange(n)[None] - torch.arange(n)[:, None]).float()
    alibi = -0.3 * rel.abs()
    assert float(toeplitz_score(alibi)) == pytest.approx(1.0, abs=1e-12)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert float(toeplitz_score(alibi, causal)) == pytest.approx(1.0, abs=1e-12)
    table = torch.randn(2 * n - 1, generator=torch.Generator().manual_seed(0))
    t5 = table[(rel + n - 1).long()]
    assert float(toeplitz_score(t5)) == pytest.approx(1.0, abs=1e-12)
    noise = torch.randn(n, n, generator=torch.Generator().manual_seed(1))
    s = float(toeplitz_score(noise))
    assert s < 0.4  # about (2n - 1) / n^2 ~ 0.16 for noise
    mixed = float(toeplitz_score(t5 + 0.3 * noise))
    assert s < mixed < 1.0
    batched = toeplitz_score(torch.stack([t5, noise]))
    assert (
        batched.shape == (2,)
        and batched[0] == pytest.approx(1.0)
        and batched[1] == pytest.approx(s)
    )
    assert math.isnan(float(toeplitz_score(torch.full((n, n), 3.0))))
    # only the valid region counts: noise outside it is ignored
    region = torch.zeros(n, n, dtype=torch.bool)
    region[:6, :6] = True
    assert float(toeplitz_score(torch.where(region, t5, noise), region)) == pytest.approx(
        1.0, abs=1e-12
    )


def test_positional_scores_find_hand_built_positional_heads():
    tokens = torch.randint(1, VOCAB, (16, POS), generator=torch.Generator().manual_seed(3))
    tokens[::3, 8:] = 0
    # ALiBi: head 1 of layer 0 has no query -> its logits are the bias alone
    model = make_model("alibi", init_std=0.6)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[1] = 0
        model.blocks[0].attn.b_Q[1] = 0
    ps = positional_scores(model, tokens, batch_size=5)
    assert ps.scores.shape == (2, 4) and ps.toeplitz.shape == (2, 4)
    assert ps.argmax(0) == (0, 1) and ps.argmax() == (0, 1)
    assert float(ps.scores[0, 1]) > 0.999 and float(ps.toeplitz[0, 1]) > 0.999
    others = ps.scores[0, [0, 2, 3]]
    assert float(others.max()) < 0.6
    # RoPE: head 2 with constant q and k (biases only) -> a pure relative-position pattern
    model = make_model("rope", init_std=0.6)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[2] = 0
        model.blocks[0].attn.W_K[2] = 0
        model.blocks[0].attn.b_Q[2] = 2.0
        model.blocks[0].attn.b_K[2] = 1.0
    ps = positional_scores(model, tokens)
    assert ps.argmax(0) == (0, 2)
    assert float(ps.scores[0, 2]) > 0.999 and float(ps.toeplitz[0, 2]) > 0.999
    assert float(ps.scores[0, [0, 1, 3]].max()) < 0.6
    json.dumps(ps.to_dict())


def test_positional_scores_absolute_position_head():
    """A head that reads only (random, learned) absolute positions: its logits are the same for
    every example but not Toeplitz, so the template score finds it and the Toeplitz score does not."""
    model = make_model("learned", n_layers=1, normalization_type=None, init_std=0.5)
    half = 16
    with torch.no_grad():
        model.W_E[:, :half] = 0  # tokens live in dims 16..31
        model.encoding.W_pos[:, half:] = 0  # positions in dims 0..15
        model.encoding.W_pos.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))
        model.encoding.W_pos[:, half:] = 0
        attn = model.blocks[0].attn
        attn.W_Q[0, half:] = 0
        attn.W_K[0, half:] = 0
        attn.b_Q[0] = 0
        attn.b_K[0] = 0
    tokens = torch.randint(1, VOCAB, (12, POS), generator=torch.Generator().manual_seed(4))
    ps = positional_scores(model, tokens)
    assert ps.argmax(0) == (0, 0)
    assert float(ps.scores[0, 0]) > 0.999
    assert float(ps.toeplitz[0, 0]) < 0.8


def test_errors():
    model = make_model("rope")
    tokens = make_tokens()
    with pytest.raises(ValueError, match="layer"):
        logit_terms(model, tokens, 5, 0)
    with pytest.raises(ValueError, match="head"):
        logit_terms(model, tokens, 0, 9)
    with pytest.raises(ValueError, match="2 examples"):
        positional_scores(model, tokens[:1])


def test_decompose_command_core(tmp_path):
    from pe_interp.commands.decompose import decompose_run
    from pe_interp.tasks import DistanceTask

    task = DistanceTask(d_vocab=24, max_between=3, max_side=2, max_len=8, seed=1)
    cfg = ModelConfig(
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_mlp=32,
        n_ctx=8,
        d_vocab=24,
        n_classes=task.n_classes,
        encoding="sinusoidal+rope",
        init_std=0.3,
    )
    model = HookedPETransformer(cfg).eval()
    batch = task.sample(8, seed=0)
    terms, scores, written = decompose_run(
        model, batch, tmp_path, layer=0, head=None, example=1, task=task
    )
    data = json.loads(written["json"].read_text())
    assert data["max_error"] < 1e-4 and data["head"] == scores.argmax(0)[1]
    assert "position-position" in data["terms"] and data["rope"]["theta"]
    for key in ("terms", "grouped", "rope"):
        assert written[key].stat().st_size > 1000
    assert "AttentionHeads" in written["html"].read_text()

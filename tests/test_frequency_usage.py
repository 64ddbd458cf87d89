"""RoPE frequency usage (issue 47, item 4b; Barbero et al. 2024, arXiv 2410.06205) on our tiny RoPE
model and on a grouped key/value Llama bridge built offline from a config.

References built here and not by the probe: each chunk's norm from a naive loop over examples,
heads and pairs on the model's own hooks of a one-example forward (the pair's dims written out:
adjacent in our models, ``(i, i + d/2)`` on a Llama bridge; a grouped key head named by hand);
the frequencies from the config (``base^(-2i/d)``); the logit shares from
:class:`~probes.decomposition.RopeTerms` of each head, masked to the causal entries between real
tokens; and the check that those pair terms plus the un-rotated part are the model's own
``hook_attn_scores``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from bridge_env import sharp_bridge
from conftest import tiny_model

from probes.common.metrics import wilson
from probes.decomposition.frequency import FrequencyUsage, frequency_usage
from probes.decomposition.frequency_findings import (
    high_frequency_positional,
    low_frequency_norm,
    top_heads,
)
from probes.decomposition.reads import attention_scale
from probes.decomposition.rope import rope_spans, rope_terms

V, PAD = 30, 0
LLAMA = {"n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "d_mlp": 40}
LLAMA |= {"n_ctx": 4096, "d_vocab": V, "pad_id": PAD}  # a long context: never computed at


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``{"ours": (model, info), "llama": (model, info)}``; ``info``: the pair layout, the
    frequencies from the config and the key head of each query head."""
    ours = tiny_model("rope", double=True, pad_id=PAD, d_vocab=V, attention_dir="causal")
    hf, bridge, _ = sharp_bridge("llama", LLAMA, 3, 4.0, tmp_path_factory.mktemp("m") / "m", [1, 2])
    d_ours, d_llama = ours.cfg.d_head, LLAMA["d_model"] // LLAMA["n_heads"]
    base = hf.config.rope_parameters["rope_theta"]
    return {
        "ours": (ours, {"halves": False, "d": d_ours, "base": 10000.0, "kv": lambda h: h}),
        "llama": (bridge, {"halves": True, "d": d_llama, "base": base, "kv": lambda h: h // 2}),
    }


def _tokens(n: int = 5, width: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, V, (n, width), generator=g)
    lengths = torch.tensor([width, 6, 9, width, 3, 8, width][:n])
    mask = torch.arange(width)[None] < lengths[:, None]
    tokens[~mask] = PAD
    return tokens, mask


def _one(model, row: torch.Tensor):
    """The one-example cache of ``row`` (its real tokens only)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(row[None])
    return cache


def _pair(x: torch.Tensor, p: int, info) -> torch.Tensor:
    """Pair ``p``'s two coordinates of ``x [..., d]``, dims written out."""
    d = info["d"]
    i, j = (p, p + d // 2) if info["halves"] else (2 * p, 2 * p + 1)
    return torch.stack((x[..., i], x[..., j]), -1).double()


@pytest.mark.parametrize("kind", ["ours", "llama"])
def test_chunk_norms_and_frequencies_equal_a_naive_loop(models, kind):
    model, info = models[kind]
    tokens, mask = _tokens()
    u = frequency_usage(model, tokens, mask, batch_size=2)
    L, H, P = 2, model.cfg.n_heads, info["d"] // 2
    theta = info["base"] ** (-torch.arange(0, info["d"], 2, dtype=torch.float64) / info["d"])
    torch.testing.assert_close(u.theta, theta[None].expand(L, -1), rtol=1e-6, atol=0)
    qn, kn = torch.zeros(L, H, P, dtype=torch.float64), torch.zeros(L, H, P, dtype=torch.float64)
    for row, m in zip(tokens, mask):
        cache = _one(model, row[m])
        for layer in range(L):
            q, k = (
                cache[f"blocks.{layer}.attn.hook_rot_q"][0],
                cache[f"blocks.{layer}.attn.hook_rot_k"][0],
            )
            for h in range(H):
                for p in range(P):
                    qn[layer, h, p] += _pair(q[:, h], p, info).norm(dim=-1).sum()
                    kn[layer, h, p] += _pair(k[:, info["kv"](h)], p, info).norm(dim=-1).sum()
    n_tok = int(mask.sum())
    assert u.n_tokens == n_tok and u.n_examples == len(tokens)
    torch.testing.assert_close(u.q_norm, qn / n_tok, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(u.k_norm, kn / n_tok, rtol=1e-5, atol=1e-7)
    if kind == "llama":  # the heads of a group share their key chunks, and not their queries
        torch.testing.assert_close(u.k_norm[:, 0], u.k_norm[:, 1])
        assert not torch.allclose(u.q_norm[:, 0], u.q_norm[:, 1])


def _terms(model, cache, layer: int, h: int, n: int):
    """:class:`RopeTerms` of query head ``h`` from the cached rotated q/k (one example)."""
    q = cache[f"blocks.{layer}.attn.hook_rot_q"][0]
    k = cache[f"blocks.{layer}.attn.hook_rot_k"][0]
    g = model.kv_layout.kv_head(h) if hasattr(model, "kv_layout") else h
    spans = rope_spans(model.encoding, layer, h, n)
    return rope_terms(q[:, h], k[:, g], spans, attention_scale(model, layer))


def _entries(model, n: int) -> torch.Tensor:
    """The (query, key) entries the model's mask allows among ``n`` real tokens."""
    full = torch.ones(n, n, dtype=torch.bool)
    return full.tril() if model.cfg.attention_dir == "causal" else full


def _model_of(model):
    from probes.common.inputs import as_probe_model

    return as_probe_model(model)


@pytest.mark.parametrize("kind", ["ours", "llama"])
def test_pair_logits_plus_unrotated_part_are_the_models_attention_scores(models, kind):
    model = _model_of(models[kind][0])
    tokens, mask = _tokens()
    for row, m in zip(tokens, mask):
        cache = _one(model, row[m])
        n = int(m.sum())
        for layer in range(2):
            scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0].double()
            causal = _entries(model, n)
            for h in range(model.cfg.n_heads):
                t = _terms(model, cache, layer, h, n)
                rebuilt = t.pair_logits.double().sum(0) + t.unrotated.double()
                assert (rebuilt - scores[h])[causal].abs().max() <= 1e-5


@pytest.mark.parametrize("kind", ["ours", "llama"])
def test_logit_shares_sum_to_one_and_equal_rope_terms_frequency_share(models, kind):
    model = _model_of(models[kind][0])
    tokens, mask = _tokens()
    u = frequency_usage(model, tokens, mask, batch_size=3)
    torch.testing.assert_close(u.logit_share.sum(-1), torch.ones(2, model.cfg.n_heads).double())
    torch.testing.assert_close(u.pattern_share.sum(-1), torch.ones(2, model.cfg.n_heads).double())
    want, want_centred = torch.zeros_like(u.logit_share), torch.zeros_like(u.logit_share)
    for i, (row, m) in enumerate(zip(tokens, mask)):
        cache, n = _one(model, row[m]), int(m.sum())
        causal = _entries(model, n)
        for layer in range(2):
            for h in range(model.cfg.n_heads):
                t = _terms(model, cache, layer, h, n)
                masked = dataclasses.replace(t, pair_logits=t.pair_logits * causal)
                share = masked.frequency_share()
                want[layer, h] += share / len(tokens)
                want_centred[layer, h] += _centred_share(t.pair_logits, causal) / len(tokens)
                if i == 0:  # a single example: the probe's share is RopeTerms' share
                    one = frequency_usage(model, row[None, m], layers=[layer])
                    torch.testing.assert_close(one.logit_share[0, h], share, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(u.logit_share, want, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(u.pattern_share, want_centred, rtol=1e-5, atol=1e-8)


def _centred_share(pair_logits: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
    """Each pair's share of the squared terms centred over the keys of each query row, a loop."""
    ss = torch.zeros(pair_logits.shape[0], dtype=torch.float64)
    for p, a in enumerate(pair_logits.double()):
        for m in range(a.shape[0]):
            row = a[m][entries[m]]
            ss[p] += ((row - row.mean()) ** 2).sum()
    return ss / ss.sum()


@pytest.mark.parametrize("kind", ["ours", "llama"])
def test_one_forward_per_batch_at_the_prompts_length(models, kind):
    model = _model_of(models[kind][0])
    tokens, mask = _tokens(7, 10)
    widths = []
    hook = model.blocks[0].register_forward_pre_hook(lambda m, a: widths.append(a[0].shape[1]))
    try:
        u = frequency_usage(model, tokens, mask, batch_size=3)
    finally:
        hook.remove()
    assert len(widths) == math.ceil(7 / 3)
    assert max(widths) <= 10  # each batch at its longest row: never the model's context
    if kind == "llama":  # the tables were computed at the prompts' length (<= 11), not 4,096
        assert all(model.encoding.rotary_spans(i, 2)[0].cos.shape[0] <= 11 for i in range(2))
    assert u.n_examples == 7


def test_save_load_round_trip(models, tmp_path):
    model = models["ours"][0]
    tokens, mask = _tokens()
    u = frequency_usage(model, tokens, mask, layers=[1], band=0.5)
    back = FrequencyUsage.load(u.save(tmp_path / "fu.json"))
    assert back.layers == (1,) and back.band == 0.5 and back.n_tokens == u.n_tokens
    for name in ("theta", "q_norm", "k_norm", "logit_share", "pattern_share"):
        torch.testing.assert_close(getattr(back, name), getattr(u, name), rtol=0, atol=0)


def _planted(keep: dict) -> object:
    """Our tiny RoPE model with head ``h`` of layer 0 reading only the pairs ``keep[h]``."""
    model = tiny_model("rope", double=True, pad_id=PAD, d_vocab=V)
    with torch.no_grad():
        attn = model.blocks[0].attn
        for h, pairs in keep.items():
            off = torch.ones(attn.W_Q.shape[-1], dtype=torch.bool)
            for p in pairs:
                off[2 * p : 2 * p + 2] = False
            for w in (attn.W_Q, attn.W_K):
                w[h][:, off] = 0.0
            for b in (attn.b_Q, attn.b_K):
                b[h][off] = 0.0
    return model


def test_findings_count_planted_heads_with_wilson_intervals():
    """Head 0 of layer 0 reads only the fastest pair, head 1 only the slowest: finding 2 counts
    head 0 and not head 1, finding 1 counts head 1 and not head 0."""
    model = _planted({0: [0], 1: [3]})
    tokens, mask = _tokens()
    u = frequency_usage(model, tokens, mask, layers=[0])
    torch.testing.assert_close(
        u.logit_share[0, 0], torch.tensor([1.0, 0, 0, 0], dtype=torch.float64)
    )
    torch.testing.assert_close(
        u.logit_share[0, 1], torch.tensor([0, 0, 0, 1.0], dtype=torch.float64)
    )
    torch.testing.assert_close(u.pattern_share[0], u.logit_share[0])
    for measure in ("logit", "pattern", "norm"):
        pos = high_frequency_positional(u, [(0, 0), (0, 1)], measure=measure)
        assert (pos.k, pos.n, pos.hits) == (1, 2, ((0, 0),))
        assert pos.interval == wilson(1, 2)
    norm = low_frequency_norm(u)
    assert (norm.k, norm.n, norm.hits) == (1, 2, ((0, 1),))
    assert "1 of 2 heads" in norm.text()
    hi, lo = u.norm_bands()
    assert float(hi[0, 0]) == pytest.approx(1.0) and float(lo[0, 1]) == pytest.approx(1.0)


def test_bands_top_heads_and_the_figure(models, tmp_path):
    from probes.decomposition.view import plot_frequency_usage

    model = models["llama"][0]
    tokens, mask = _tokens()
    u = frequency_usage(model, tokens, mask, band=0.25)  # 8 pairs: 2 per band
    high, low = u.band_masks()
    assert high[0].tolist() == [True, True] + [False] * 6
    assert low[0].tolist() == [False] * 6 + [True, True]
    hi, lo = u.logit_bands()
    torch.testing.assert_close(hi, u.logit_share[..., :2].sum(-1))
    torch.testing.assert_close(lo, u.logit_share[..., -2:].sum(-1))
    scores = torch.tensor([[0.1, 0.9, float("nan"), 0.3], [0.5, 0.2, 0.8, 0.0]])
    assert top_heads(scores, 3) == [(0, 1), (1, 2), (1, 0)]
    assert top_heads(scores, 2, layers=[0]) == [(0, 1), (0, 3)]
    fig = plot_frequency_usage(u, tmp_path / "f.png", positional=[(1, 2)])
    assert (tmp_path / "f.png").stat().st_size > 0 and len(fig.axes) >= 2


def test_bad_inputs_are_refused_in_one_line(models):
    model = models["ours"][0]
    tokens, mask = _tokens()
    with pytest.raises(ValueError, match="does not rotate"):
        frequency_usage(tiny_model("learned", pad_id=PAD, d_vocab=V), tokens, mask)
    with pytest.raises(ValueError, match=r"band must be a number in \(0, 0.5\]"):
        frequency_usage(model, tokens, mask, band=0.6)
    with pytest.raises(ValueError, match="out of range"):
        frequency_usage(model, tokens, mask, layers=[5])
    u = frequency_usage(model, tokens, mask, layers=[0])
    with pytest.raises(ValueError, match="was not measured"):
        high_frequency_positional(u, [(1, 0)])
    with pytest.raises(ValueError, match="measure must be one of"):
        high_frequency_positional(u, [(0, 0)], measure="energy")


def test_a_partial_rotary_bridge_that_caches_no_rotated_vectors(tmp_path):
    """GPT-NeoX's bridge caches only ``hook_q``/``hook_k`` (rotated by the encoding as the bridge
    rotates them) and rotates a quarter of each head: 2 pairs of 16 dims, ``(i, i + 2)``. The
    rotation leaves each chunk's norm as it is, so the naive norms read the un-rotated hooks."""
    shape = {**LLAMA, "n_ctx": 64}
    del shape["n_kv_heads"]
    hf, model, _ = sharp_bridge("gpt-neox", shape, 2, 4.0, tmp_path / "m", [1, 2])
    tokens, mask = _tokens()
    u = frequency_usage(model, tokens, mask, band=0.5)
    base = hf.config.rope_parameters["rope_theta"]
    theta = base ** (-torch.arange(0, 4, 2, dtype=torch.float64) / 4)
    torch.testing.assert_close(u.theta, theta[None].expand(2, -1), rtol=1e-6, atol=0)
    torch.testing.assert_close(u.logit_share.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    info = {"halves": True, "d": 4}
    qn = torch.zeros(2, 4, 2, dtype=torch.float64)
    for row, m in zip(tokens, mask):
        cache = _one(model, row[m])
        for layer in range(2):
            q = cache[f"blocks.{layer}.attn.hook_q"][0]
            for h in range(4):
                for p in range(2):
                    qn[layer, h, p] += _pair(q[:, h, :4], p, info).norm(dim=-1).sum()
    torch.testing.assert_close(u.q_norm, qn / int(mask.sum()), rtol=1e-5, atol=1e-7)

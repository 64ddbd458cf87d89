"""ALiBi read from a bridge's own forward (:mod:`pe_interp.models.bridge.alibi`), not from its model type:
BLOOM, MPT and Falcon (``alibi=True``, which also builds a rotary module it never calls), tiny and
random, built from their configs offline.

References built here and not by the probe: each model's slopes from Hugging Face's own ALiBi
code (``build_alibi_tensor``, ``build_mpt_alibi_tensor``, Falcon's ``inv_norm_factor`` and its eager
attention's second addition of the bias), and each
head's route share against a naive loop that adds ``slope * (sigma(j) - j)`` to that head's
scores with those slopes."""

from __future__ import annotations

import pytest
import torch
import transformers
from prompt_env import make_tokenizer

from pe_interp.models.bridge.alibi import _fit, read_alibi_slopes
from pe_interp.models.bridge.hf_arch import boot_bridge, build_hf_model, save_model_dir
from pe_interp.models.bridge.model import BridgedModel
from probes import route_shares
from probes.common.inputs import position_permutation

TOK = make_tokenizer()
V, PAD = len(TOK), TOK.pad_token_id
ANSWERS = [V - 4, V - 3, V - 2, V - 1]
H, D, P, N = 4, 32, 8, 12


def _falcon_config(heads: int, hidden: int):
    """Falcon with ALiBi (its rotary module built, never called), attention and MLP side by side."""
    return transformers.FalconConfig(
        vocab_size=V,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=2,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=False,
        parallel_attn=True,
        bias=True,
    )


CONFIGS = {
    "mpt": lambda: transformers.MptConfig(
        vocab_size=V, d_model=D, n_heads=H, n_layers=2, max_seq_len=32, expansion_ratio=2
    ),
    "falcon": lambda: _falcon_config(H, D),
}


def _reference_slopes(family: str, hf) -> torch.Tensor:
    """The slope each head's score gains per key position, from Hugging Face's own ALiBi code."""
    if family == "mpt":
        from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

        t = build_mpt_alibi_tensor(H, 2, hf.config.attn_config.alibi_bias_max)  # [H, 1, 2]
        return (t[:, 0, 1] - t[:, 0, 0]).float()
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    t = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), H, torch.float32)  # [H, 1, 2]
    # Hugging Face's eager Falcon adds the bias twice, scaled: once folded into the causal mask and
    # once into the scores before the scale (its SDPA path once); the bridge runs the eager
    # attention (its patterns equal Hugging Face's output_attentions to 3e-8)
    return 2 * t[:, 0, 1] * hf.transformer.h[0].self_attention.inv_norm_factor


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = {}
    for family, config in CONFIGS.items():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            hf = transformers.AutoModelForCausalLM.from_config(config()).eval()
        with torch.no_grad():  # sharper than the initialisation, so that the answer moves
            for name, p in hf.named_parameters():
                if name.endswith(("lm_head.weight", "wte.weight", "word_embeddings.weight")):
                    p.mul_(30.0)
        path = save_model_dir(hf, TOK, tmp_path_factory.mktemp(family) / "model")
        out[family] = (hf, BridgedModel(boot_bridge(path), answers=ANSWERS))
    return out


@pytest.mark.parametrize("family", list(CONFIGS))
def test_alibi_is_read_from_the_scores_with_the_models_own_slopes(built, family):
    hf, model = built[family]
    assert model.cfg.encoding_name == f"{family}: alibi"
    assert model.cfg.encoding_kind == "additive"
    assert not model.encoding.rotates  # Falcon's unused rotary module is not its encoding
    want = _reference_slopes(family, hf)
    torch.testing.assert_close(model.encoding.slopes, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        read_alibi_slopes(model.bridge, n_tokens=11), want, rtol=1e-5, atol=1e-7
    )


def test_falcons_bias_built_in_bfloat16_is_still_read_as_alibi(tmp_path):
    """With 12 heads Falcon's slopes are not all powers of two, and its bias, slope times
    position rounded to bfloat16, is linear in the position only to 2^-8 of itself."""
    heads = 12
    config = _falcon_config(heads, 8 * heads)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    model = BridgedModel(boot_bridge(save_model_dir(hf, TOK, tmp_path / "m")))
    assert model.cfg.encoding_name == "falcon: alibi" and not model.encoding.rotates
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    bias = build_alibi_tensor(torch.ones(1, 40, dtype=torch.long), heads, torch.float32)[:, 0]
    t = bias[:, 1]
    assert float((bias - t[:, None] * torch.arange(40)).abs().max()) > 1e-3  # not linear in j
    want = 2 * t * hf.transformer.h[0].self_attention.inv_norm_factor  # as _reference_slopes
    torch.testing.assert_close(model.encoding.slopes, want, rtol=2.0**-8, atol=0.0)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox", "bloom"])
def test_no_alibi_where_positions_enter_otherwise_and_blooms_own_table_where_they_do(
    arch, tmp_path
):
    hf = build_hf_model(
        arch, seed=1, n_layers=2, d_model=32, n_heads=4, d_mlp=40, n_ctx=16, d_vocab=V, pad_id=PAD
    )
    bridge = boot_bridge(save_model_dir(hf, TOK, tmp_path / "m"))
    got = read_alibi_slopes(bridge)
    if arch != "bloom":
        assert got is None
        if arch == "gpt2":  # the fit itself ran: q.k scaled, and no bias
            _, cache = bridge.run_with_cache(torch.randint(3, 20, (1, 7)))
            pre = "blocks.1.attn.hook_"
            slopes, _ = _fit(cache[pre + "q"], cache[pre + "k"], cache[pre + "attn_scores"])
            assert torch.equal(slopes, torch.zeros(4))
        return
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    want = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), 4, torch.float32)[:, 0, 1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def _move(slopes, sigma, layer, heads):
    """A hook adding ``slope_h * (sigma(j) - j)`` to the scores of ``heads`` of ``layer`` where the
    causal mask allows."""

    def move(scores, hook):
        scores = scores.clone()
        shift = (sigma - torch.arange(P)[None]).to(scores.dtype)  # [n, k]
        for h in heads:
            allowed = scores[:, h] > torch.finfo(scores.dtype).min / 2
            moved = scores[:, h] + float(slopes[h]) * shift[:, None, :]
            scores[:, h] = torch.where(allowed, moved, scores[:, h])
        return scores

    return [(f"blocks.{layer}.attn.hook_attn_scores", move)]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_route_shares_on_an_alibi_bridge_equal_a_naive_loop_with_the_models_slopes(built, family):
    hf, model = built[family]
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(3, V - 4, (N, P), generator=g)
    corrupt = clean.gather(1, torch.stack([torch.randperm(P, generator=g) for _ in range(N)]))
    good = torch.randint(0, 4, (N,), generator=g)
    bad = (good + 1) % 4
    r = route_shares(model, clean, corrupt, good, bad, n_bootstrap=0)
    sigma = position_permutation(clean, corrupt)
    slopes = _reference_slopes(family, hf)

    def ld(hooks):
        with torch.no_grad():
            logits = model.run_with_hooks(clean, fwd_hooks=hooks)
        return (logits.gather(1, good[:, None]) - logits.gather(1, bad[:, None]))[:, 0].double()

    base = ld([])
    every = [hk for layer in range(2) for hk in _move(slopes, sigma, layer, range(H))]
    effect = float((base - ld(every)).mean())
    assert abs(effect) > 1e-3 and r.effect == pytest.approx(effect, rel=1e-4, abs=1e-6)
    assert r.routes.all()
    for layer in range(2):
        for h in range(H):
            share = float((base - ld(_move(slopes, sigma, layer, [h]))).mean()) / effect
            assert r.shares[layer, h] == pytest.approx(share, rel=1e-3, abs=1e-4), (layer, h)


@pytest.mark.parametrize("arch", ["gpt2", "bloom"])
def test_masked_scores_at_minus_infinity_do_not_stop_the_read(arch, tmp_path):
    """TransformerLens' compatibility mode fills masked scores with -inf."""
    hf = build_hf_model(
        arch, seed=1, n_layers=2, d_model=32, n_heads=4, d_mlp=40, n_ctx=16, d_vocab=V, pad_id=PAD
    )
    bridge = boot_bridge(save_model_dir(hf, TOK, tmp_path / "m"))
    bridge.enable_compatibility_mode(no_processing=True)
    _, cache = bridge.run_with_cache(torch.randint(3, 20, (1, 7)))
    assert cache["blocks.0.attn.hook_attn_scores"][0, 0, 0, 1] == float("-inf")
    got = read_alibi_slopes(bridge)
    assert (got is None) == (arch == "gpt2")
    assert BridgedModel(bridge).cfg.encoding_kind == "additive"


def _scores(q, k, slopes, rotate: bool = False):
    """Scores as a model in q's dtype computes them: ``q.k / sqrt(d) + slope_h j`` (or with q and
    k rotated by RoPE first, and no bias), masked to -inf above the diagonal."""
    p, d = q.shape[1], q.shape[-1]
    if rotate:
        ang = torch.arange(p)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)  # [p, d/2]
        cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)

        def turn(x):
            x = x.float()
            half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
            return (x * cos[None, :, None] + half * sin[None, :, None]).to(q.dtype)

        q, k = turn(q), turn(k)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / d**0.5
    s = s + (slopes[:, None, None] * torch.arange(p)).to(q.dtype)
    return s.masked_fill(~torch.ones(p, p, dtype=torch.bool).tril(), float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fit_finds_a_bias_in_half_precision_and_no_bias_where_there_is_none(dtype):
    g = torch.Generator().manual_seed(0)
    q, k = (
        (10 * torch.randn(1, 9, 4, 16, generator=g)).to(dtype),
        torch.randn(1, 9, 4, 16, generator=g).to(dtype),
    )
    slopes = torch.tensor([0.5, 0.125, 0.03125, 2.0**-0.5])
    got, _ = _fit(q, k, _scores(q, k, slopes))
    torch.testing.assert_close(
        got.float(), slopes, rtol=0.0, atol=0.02 if dtype != torch.float32 else 1e-5
    )
    none, _ = _fit(q, k, _scores(q, k, torch.zeros(4)))
    assert torch.equal(none, torch.zeros(4, dtype=none.dtype))  # no bias: every slope 0
    assert _fit(q, k, _scores(q, k, torch.zeros(4), rotate=True)) is None  # a rotation: no fit

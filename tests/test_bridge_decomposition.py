"""The logit decomposition on a TransformerLens bridge (issue 38): Llama's and GPT-NeoX's rotary
heads (Hugging Face's ``rotate_half`` pairs) and GPT-2's learned positions, on shapes the other
bridge tests do not build.

References built here and not by the probe: the terms must sum to the bridge's own
``hook_attn_scores``; the rotation the encoding applies must equal Llama's own ``hook_rot_q/k``;
the direct term of layer 0 must equal the Hugging Face model run with ``position_ids = 0`` (no
rotation anywhere) subtracted from the model run as it is, in layer 0, where both see the same
input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bridge_env import sharp_bridge

from pe_interp.models.bridge.hf_arch import build_hf_model, save_model_dir, word_tokenizer
from probes import logit_terms, positional_scores

V, PAD = 30, 0
ANSWERS = [26, 27, 28, 29]
SHAPE = {
    "n_layers": 2,
    "d_model": 40,
    "n_heads": 4,
    "d_mlp": 24,
    "n_ctx": 14,
    "d_vocab": V,
    "pad_id": PAD,
}


@pytest.fixture(scope="module")
def bridges(tmp_path_factory):
    """``bridges(arch)``: ``(hf, BridgedModel, directory)``, built once per architecture, with
    sharper attention than the initialisation's and biases that are not 0."""
    built: dict[str, tuple] = {}

    def get(arch: str) -> tuple:
        if arch not in built:
            out = tmp_path_factory.mktemp(arch) / "model"
            built[arch] = sharp_bridge(arch, SHAPE, 5, 8.0, out, ANSWERS, bias_noise=0.1)
        return built[arch]

    return get


def _tokens(n: int = 6):
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([11, 7, 11, 9, 5, 11][:n])
    tokens = torch.randint(1, 26, (n, 11), generator=g)
    mask = torch.arange(11)[None] < lengths[:, None]
    tokens[~mask] = PAD
    return tokens, mask


@pytest.mark.parametrize("arch", ["llama", "gpt-neox", "gpt2"])
@pytest.mark.parametrize("layer", [0, 1])
def test_the_terms_sum_to_the_bridges_own_scores(bridges, arch, layer):
    _, model, _ = bridges(arch)
    tokens, mask = _tokens()
    for head in (0, 3):
        t = logit_terms(model, tokens, layer, head, pad_mask=mask, example=1)
        assert t.check() < 1e-4, (arch, layer, head)
        assert t.region.sum() == 7 * 8 // 2  # causal, 7 real tokens
        if layer == 0:
            want = {"content", "offset"} | ({"position"} if arch == "gpt2" else set())
            assert set(t.components) == want
            assert float(t.terms["content-content"].abs().max()) > 1e-3
        else:
            assert set(t.terms) == {"qk"}
        if arch == "gpt2":
            assert t.rope is None
            continue
        d_head = SHAPE["d_model"] // SHAPE["n_heads"]
        share = (getattr(model.bridge.original_model.config, "rope_parameters", None) or {}).get(
            "partial_rotary_factor", 1.0
        )
        rotary = int(d_head * share) // 2 * 2
        assert t.rope.n_pairs == rotary // 2
        torch.testing.assert_close(
            t.rope.hadamard().to(t.rope.pair_logits.dtype), t.rope.pair_logits, rtol=0, atol=1e-5
        )
        assert bool((t.rope.unrotated != 0).any()) == (rotary < d_head)


def test_the_encoding_rotates_as_llamas_bridge_does(bridges):
    """Llama's bridge caches its rotated q/k (GPT-NeoX's does not: there the encoding rotates)."""
    _, model, _ = bridges("llama")
    tokens, mask = _tokens()
    _, cache = model.run_with_cache(tokens, mask)
    for layer in range(SHAPE["n_layers"]):
        pre = f"blocks.{layer}.attn."
        q, k = model.encoding.rotate(cache[pre + "hook_q"], cache[pre + "hook_k"], layer)
        torch.testing.assert_close(q, cache[pre + "hook_rot_q"], rtol=0, atol=1e-6)
        torch.testing.assert_close(k, cache[pre + "hook_rot_k"], rtol=0, atol=1e-6)


def _direct_reference(model, tokens, mask) -> list[float]:
    """Each layer-0 head's direct term from the model itself: its scores as they are minus its
    scores with ``position_ids = 0`` (no rotation anywhere; layer 0 sees the same input both
    times), variance over the allowed entries as a share of the scores' variance."""
    scores = {}
    for name, ids in (("as is", None), ("unrotated", torch.zeros_like(tokens))):
        grab = (
            "blocks.0.attn.hook_attn_scores",
            lambda s, hook, name=name: scores.__setitem__(name, s),
        )
        with torch.no_grad():
            model.bridge.run_with_hooks(
                tokens, fwd_hooks=[grab], attention_mask=mask.long(), position_ids=ids
            )
    s, d = scores["as is"].double(), scores["as is"].double() - scores["unrotated"].double()
    ok = (s > -1e30) & mask[:, None, :, None]
    return [
        float(d[:, h][ok[:, h]].var(unbiased=False) / s[:, h][ok[:, h]].var(unbiased=False))
        for h in range(s.shape[1])
    ]


@pytest.mark.parametrize("arch", ["llama", "gpt-neox", "gpt2", "bloom"])
def test_the_direct_term_of_layer_0_is_the_model_with_and_without_rotation(bridges, arch):
    hf, model, _ = bridges(arch)
    tokens, mask = _tokens()
    ps = positional_scores(model, tokens, pad_mask=mask)
    assert torch.isfinite(ps.scores).all() and torch.isfinite(ps.toeplitz).all()
    if arch == "bloom":  # its ALiBi has no hook: the direct term is not measured, the rest is
        assert torch.isnan(ps.direct).all()
        return
    if arch == "gpt2":  # learned positions enter the residual stream, no head's logits of their own
        assert (ps.direct == 0).all()
        return
    want = _direct_reference(model, tokens, mask)
    np.testing.assert_allclose(ps.direct[0].numpy(), want, rtol=1e-3, atol=1e-6)
    assert min(want) > 1e-3


def test_bloom_says_in_one_line_why_its_terms_cannot_be_split(bridges):
    _, model, _ = bridges("bloom")
    tokens, mask = _tokens()
    with pytest.raises(
        ValueError,
        match="logit_terms: bloom: alibi: the bridge adds the ALiBi bias inside the attention scores",
    ):
        logit_terms(model, tokens, 0, 0, pad_mask=mask)


@pytest.mark.parametrize("arch", ["llama", "bloom"])  # one rotary, one refused
def test_decompose_reads_a_saved_model_directory_with_task(arch, tmp_path, capsys):
    import json

    from pe_interp.cli import main

    # smoke's task 1 needs 38 token ids (32 inputs, 6 answers) and 16 positions
    hf = build_hf_model(arch, seed=2, **{**SHAPE, "d_vocab": 38, "n_ctx": 16})
    run = save_model_dir(hf, word_tokenizer(38, PAD), tmp_path / "m")
    argv = [
        "decompose",
        str(run),
        "--task",
        "distance",
        "--preset",
        "smoke",
        "--layer",
        "1",
        "--head",
        "2",
        "--no-figures",
    ]
    if arch == "bloom":
        from bad_input_env import expect_cli_refusal

        capsys.readouterr()  # saving the model wrote a progress bar
        expect_cli_refusal(argv, r"adds the ALiBi bias inside the attention scores", capsys)
        return
    assert main(argv) == 0
    saved = json.loads((run / "decompose_L1H2.json").read_text())
    assert (
        saved["max_error"] < 1e-4
        and saved["model_encoding"].startswith("llama")
        and saved["rope"] is not None
    )
    assert "where position enters" in capsys.readouterr().out


def test_grouped_key_value_heads_decompose_and_route_shares_run(tmp_path):
    """A Llama with 2 key/value heads for 4 query heads (as Llama 3 and Mistral share them): the
    terms of every query head sum to the bridge's scores with its group's keys, the direct term
    matches the model run without rotation, and route shares run per query head (their values:
    tests/test_bridge_grouped.py)."""
    import transformers

    from pe_interp.models.bridge.hf_arch import boot_bridge, hf_config
    from pe_interp.models.bridge.model import BridgedModel
    from probes import route_shares

    cfg = hf_config("llama", **SHAPE)
    cfg.num_key_value_heads = 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    model = BridgedModel(
        boot_bridge(save_model_dir(hf, word_tokenizer(V, PAD), tmp_path / "m")), answers=ANSWERS
    )
    tokens, mask = _tokens()
    for layer in (0, 1):
        for head in range(SHAPE["n_heads"]):
            assert (
                logit_terms(model, tokens, layer, head, pad_mask=mask, example=2).check() < 1e-4
            ), (layer, head)
    ps = positional_scores(model, tokens, pad_mask=mask)
    want = _direct_reference(model, tokens, mask)
    np.testing.assert_allclose(ps.direct[0].numpy(), want, rtol=1e-3, atol=1e-6)
    assert min(want) > 1e-3  # every head's direct term is there to be matched
    full = tokens[[0, 2, 5]]  # the rows without padding, and the same tokens reversed
    r = route_shares(
        model,
        full,
        full.flip(1),
        torch.zeros(3, dtype=torch.long),
        torch.ones(3, dtype=torch.long),
        n_bootstrap=0,
    )
    assert r.routes.all() and np.isfinite(r.shares).all()

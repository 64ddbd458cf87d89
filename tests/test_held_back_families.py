"""Families no other test builds (issue 47, item 3): every probe reads a bridge's positions from its
config and hooks, so a family it was never tried on either matches a naive loop or refuses in one
line that names what the model lacks.

Eight ``transformers`` architectures, tiny and random, built from their configs offline, saved with
a word-level tokenizer and booted as TransformerLens bridges: Qwen3 (QK-norm per head before the
rotation, q/k/v biases), Qwen2 (q/k/v biases, a sliding window on layer 1 only), Mistral (a sliding window on
every layer), Gemma 2 (sliding and global layers alternating, attention-logit soft-capping, scaled
and tied embeddings), Gemma 3 (QK-norm, a RoPE base per layer type: 10,000 on sliding layers,
1,000,000 on global ones; scaled and tied embeddings), Phi-3 (fused q/k/v, partial rotary, no hook
on the rotated q/k), OLMo 2 (QK-norm over the whole projection, no norm before attention) and
StableLM (partial rotary, a per-head LayerNorm on q and k whose scale the bridge does not hook).

References built here and not by the probes: a ``hook_z`` loop on the bridge itself (ablation); the
Hugging Face model run with ``position_ids = σ``, and each head moved by handing that one layer's
attention the model's own rotary tables at σ and keeping that head's output (route shares); the
model run with ``position_ids = 0`` (the decomposition's direct term); each layer's
``hook_cos``/``hook_sin`` and the config's RoPE base (the rotation tables); a per-layer template
fit written out here (positional scores over sliding-window layers); the prompt path's
``context_limit`` (a sliding window shorter than the context is the limit)."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import transformers
from prompt_env import make_tokenizer

from pe_interp.models.bridge.hf_arch import boot_bridge, save_model_dir
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.prompts import Induction, check_fits, context_limit, family_accuracy
from probes import ablate_heads, logit_terms, positional_scores, route_shares
from probes.common.inputs import position_permutation

TOK = make_tokenizer()
V, PAD = len(TOK), TOK.pad_token_id
ANSWERS = [V - 4, V - 3, V - 2, V - 1]
L, H, KV, DH, WINDOW, P = 2, 4, 2, 8, 6, 9
COMMON = {
    "vocab_size": V,
    "hidden_size": H * DH,
    "intermediate_size": 48,
    "num_hidden_layers": L,
    "num_attention_heads": H,
    "num_key_value_heads": KV,
    "max_position_embeddings": 64,
    "pad_token_id": PAD,
    "bos_token_id": None,
    "eos_token_id": None,
}
GEMMA = {"head_dim": DH, "sliding_window": WINDOW, "query_pre_attn_scalar": 16}
# family -> (config class, its own settings); the tiny shape above is every family's
FAMILIES = {
    "qwen3": (
        "Qwen3Config",
        {"head_dim": DH, "attention_bias": True, "tie_word_embeddings": False},
    ),
    "qwen2": (
        "Qwen2Config",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "mistral": ("MistralConfig", {"head_dim": DH, "sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", GEMMA),
    "gemma3": (
        "Gemma3TextConfig",
        {**GEMMA, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "phi3": ("Phi3Config", {"partial_rotary_factor": 0.5, "tie_word_embeddings": False}),
    "olmo2": ("Olmo2Config", {"tie_word_embeddings": False}),
    "stablelm": (
        "StableLmConfig",
        {"partial_rotary_factor": 0.5, "qk_layernorm": True, "tie_word_embeddings": False},
    ),
}
SLIDING = {"qwen2", "mistral", "gemma2", "gemma3"}
# what a family lacks for the logit decomposition, as its one-line refusal says it
SOFTCAP = "attention logit soft-capping (attn_logit_softcapping = 50)"
LAYER0_NORM = (
    "a norm in layer 0 whose scale cannot be frozen (q_norm: the bridge does not hook its scale"
)
REFUSES = {"gemma2": {0: SOFTCAP, 1: SOFTCAP}, "stablelm": {0: LAYER0_NORM}}


def _config(family: str):
    cls, own = FAMILIES[family]
    return getattr(transformers, cls)(**COMMON, **own)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """``families(name)``: ``(hf, BridgedModel, directory)``, built once per family, its query and
    key projections and its readout sharpened so that positions move the answer (Qwen2's q/k
    biases drawn large, so that its logits are mostly a function of positions)."""
    built: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in built:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(7)
                hf = transformers.AutoModelForCausalLM.from_config(_config(family)).eval()
            with torch.no_grad():
                for name, p in hf.named_parameters():
                    if name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                        p.mul_(4.0)
                    elif name.endswith(("q_norm.weight", "k_norm.weight")) and "gemma" in family:
                        p.add_(1.0)  # Gemma's norms scale by 1 + weight
                    elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                        p.mul_(2.0)
                    elif family == "qwen2" and name.endswith(("q_proj.bias", "k_proj.bias")):
                        # q and k mostly the same at every token
                        p.copy_(
                            4.0 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1))
                        )
                    elif name.endswith("lm_head.weight") or (
                        name.endswith("embed_tokens.weight") and hf.config.tie_word_embeddings
                    ):
                        p.mul_(40.0)
            out = save_model_dir(hf, TOK, tmp_path_factory.mktemp(family) / "model")
            built[family] = (hf, BridgedModel(boot_bridge(out), answers=ANSWERS), out)
        return built[family]

    return get


def _examples(n: int = 8, seed: int = 0):
    """Right-padded rows of 4..P real tokens (ids past the specials, none an answer), labels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, P + 1, (n,), generator=g)
    lengths[0] = P
    tokens = torch.randint(3, V - 4, (n, P), generator=g)
    mask = torch.arange(P)[None] < lengths[:, None]
    tokens[~mask] = PAD
    return tokens, mask, torch.randint(0, len(ANSWERS), (n,), generator=g)


def _pairs(n: int = 12):
    """Position-only pairs: the same P tokens in another order, and a label each way."""
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(3, V - 4, (n, P), generator=g)
    order = torch.stack([torch.randperm(P, generator=g) for _ in range(n)])
    good = torch.randint(0, 4, (n,), generator=g)
    return clean, clean.gather(1, order), good, (good + 1) % 4


def _ld(logits, good, bad):
    """The logit difference of the last position's answer logits ``[n]``."""
    a = logits[:, -1][:, ANSWERS]
    return (a.gather(1, good[:, None])[:, 0] - a.gather(1, bad[:, None])[:, 0]).double()


# ---------------------------------------------------------------------------- (a) ablation
@pytest.mark.parametrize("family", list(FAMILIES))
def test_zero_ablation_equals_a_naive_hook_z_loop(families, family):
    hf, model, _ = families(family)
    tokens, mask, labels = _examples()
    bridge = model.bridge

    def loss(hooks=()):
        with torch.no_grad():
            logits = bridge.run_with_hooks(
                tokens, fwd_hooks=list(hooks), attention_mask=mask.long()
            )
        last = logits[torch.arange(len(tokens)), mask.sum(1) - 1][:, ANSWERS]
        return torch.nn.functional.cross_entropy(last.float(), labels, reduction="none").double()

    with torch.no_grad():  # the bridge is the model: its logits are Hugging Face's
        ref = hf(tokens, attention_mask=mask.long()).logits
        ours = bridge(tokens, attention_mask=mask.long())
    assert (ours - ref)[mask].abs().max() <= 1e-4
    # the sweep restarts at each layer's input: a check on the bridge itself found that exact
    # (bridge_forward.resumes_exactly), no list of model types names these families
    assert model.can_resume
    # where positions enter, read from the bridge's rotary module and config, no table of names
    assert model.cfg.encoding_kind == "multiplicative", model.cfg.encoding_name
    share = FAMILIES[family][1].get("partial_rotary_factor")
    want = f"partial rotary ({share:g} of each head)" if share else "rope"
    assert model.cfg.encoding_name == f"{hf.config.model_type}: {want}"
    got = ablate_heads(
        model, tokens, labels, pad_mask=mask, metric="loss", n_bootstrap=0, per_example=True
    )
    assert abs(got.baseline - float(loss().mean())) <= 1e-5
    for layer in range(L):
        for head in range(H):

            def zero(z, hook, head=head):
                z = z.clone()
                z[:, :, head] = 0.0
                return z

            want = loss([(f"blocks.{layer}.attn.hook_z", zero)])
            np.testing.assert_allclose(got.per_example[layer, head], want.numpy(), atol=1e-5)
            assert abs(got.values[layer, head] - float(want.mean())) <= 1e-5


# ---------------------------------------------------------------------------- (b) route shares
def _rotary_tables(hf, layer: int, positions):
    """The model's own rotary tables for ``layer`` at ``positions [n, P]`` (its layer type's
    RoPE where the rotary module takes one)."""
    rotary = hf.model.rotary_emb
    x = torch.zeros(1, dtype=hf.dtype)
    types = getattr(hf.config, "layer_types", None)
    if "layer_type" in inspect.signature(rotary.forward).parameters and types:
        return rotary(x, positions, types[layer])
    return rotary(x, positions)


def _moved_head_ld(hf, clean, sigma, good, bad, layer: int):
    """``ld`` with each head of ``layer`` in turn seeing σ: that layer's attention handed the model's
    own tables at σ (every other layer the true ones), the output of that one head kept (the input
    of the output projection), the rest clean. ``[n_heads, n]``."""
    attn = hf.model.layers[layer].self_attn
    moved = {}

    def at_sigma(module, args, kwargs):
        kwargs["position_embeddings"] = _rotary_tables(hf, layer, sigma)
        return args, kwargs

    def keep(module, args):
        moved["z"] = args[0].detach().clone()

    ones = torch.ones_like(clean)
    hooks = [
        attn.register_forward_pre_hook(at_sigma, with_kwargs=True),
        attn.o_proj.register_forward_pre_hook(keep),
    ]
    try:
        with torch.no_grad():
            hf(clean, attention_mask=ones)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for head in range(H):
        cols = slice(head * DH, (head + 1) * DH)

        def put(module, args, cols=cols):
            z = args[0].clone()
            z[..., cols] = moved["z"][..., cols]
            return (z,)

        handle = attn.o_proj.register_forward_pre_hook(put)
        try:
            with torch.no_grad():
                out.append(_ld(hf(clean, attention_mask=ones).logits, good, bad))
        finally:
            handle.remove()
    return torch.stack(out)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_route_shares_equal_the_model_moved_one_head_at_a_time(families, family):
    hf, model, _ = families(family)
    clean, corrupt, good, bad = _pairs()
    r = route_shares(model, clean, corrupt, good, bad, n_bootstrap=0)
    sigma = position_permutation(clean, corrupt)
    ones = torch.ones_like(clean)
    with torch.no_grad():
        ld_clean = _ld(hf(clean, attention_mask=ones).logits, good, bad)
        ld_all = _ld(hf(clean, attention_mask=ones, position_ids=sigma).logits, good, bad)
        ld_cf = _ld(hf(corrupt, attention_mask=ones).logits, good, bad)
    effect = float((ld_clean - ld_all).mean())
    # the identities: every route moved is the model run at positions σ; the counterfactual effect
    # and the gap between the two are the model's own
    assert abs(effect) > 0.02, effect
    assert r.effect == pytest.approx(effect, rel=1e-4, abs=1e-6)
    assert r.counterfactual_effect == pytest.approx(float((ld_clean - ld_cf).mean()), abs=1e-5)
    assert r.identity_gap == pytest.approx(float((ld_all - ld_cf).abs().mean()), abs=1e-5)
    assert r.routes.all()
    naive = np.stack(
        [
            (
                (ld_clean[None] - _moved_head_ld(hf, clean, sigma, good, bad, layer)).mean(1)
                / effect
            ).numpy()
            for layer in range(L)
        ]
    )
    assert np.abs(naive).max() > 1e-2  # the heads do carry position
    np.testing.assert_allclose(r.shares, naive, rtol=0, atol=1e-4)


# ---------------------------------------------------------------------------- (c) decomposition
def _scores_at(model, tokens, ids=None) -> list:
    """Every layer's ``hook_attn_scores`` with ``position_ids = ids`` (None: as the model runs)."""
    seen = {}
    hooks = [
        (f"blocks.{i}.attn.hook_attn_scores", lambda s, hook: seen.__setitem__(hook.name, s))
        for i in range(L)
    ]
    with torch.no_grad():
        model.bridge.run_with_hooks(
            tokens, fwd_hooks=hooks, attention_mask=torch.ones_like(tokens), position_ids=ids
        )
    return [seen[f"blocks.{i}.attn.hook_attn_scores"].double() for i in range(L)]


def _template_r2(scores, ok) -> np.ndarray:
    """positional_scores' template written out: per head, the mean logit at (i, j) over one half of
    the examples scoring the other half (the entries each head's own mask allows in both), R^2
    both ways, averaged, clipped to [0, 1]. ``scores``, ``ok``: ``[n, H, q, k]``."""
    half = torch.arange(scores.shape[0]) % 2
    out = []
    for h in range(scores.shape[1]):
        r2 = []
        for a, b in ((0, 1), (1, 0)):
            sa, oa = scores[half == a, h], ok[half == a, h]
            sb, ob = scores[half == b, h], ok[half == b, h]
            both = (oa.sum(0) > 0) & (ob.sum(0) > 0)
            t = (sa * oa).sum(0) / oa.sum(0).clamp(min=1)
            sel = ob & both[None]
            y, fit = sb[sel], t.expand_as(sb)[sel]
            r2.append(1 - float(((y - fit) ** 2).sum() / ((y - y.mean()) ** 2).sum()))
        out.append(min(max(sum(r2) / 2, 0.0), 1.0))
    return np.array(out)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_decomposition_matches_the_scores_or_says_what_it_lacks(families, family):
    _, model, _ = families(family)
    tokens, mask, _ = _examples()
    for layer in range(L):
        refusal = REFUSES.get(family, {}).get(layer)
        for head in (0, 3):
            if refusal is not None:
                with pytest.raises(ValueError, match=f"^logit_terms: {family}") as err:
                    logit_terms(model, tokens, layer, head, pad_mask=mask, example=1)
                assert refusal in str(err.value) and "\n" not in str(err.value)
                continue
            t = logit_terms(model, tokens, layer, head, pad_mask=mask, example=1)
            assert t.check() < 1e-4, (layer, head, t.check())
            span = model.encoding.rotary_spans(layer, P)[0]
            assert t.rope.n_pairs == span.dim // 2
            assert bool((t.rope.unrotated != 0).any()) == (span.dim < DH)
            if layer == 0:
                assert set(t.components) == {"content", "offset"}
    # positional scores: the direct term of layer 0 is the model with and without rotation (where
    # the terms are read), and the template is fitted over each layer's own mask
    full = _pairs(16)[0]
    ps = positional_scores(model, full)
    real, flat = _scores_at(model, full), _scores_at(model, full, torch.zeros_like(full))
    for layer in range(L):
        ok = real[layer] > -1e30
        np.testing.assert_allclose(
            ps.scores[layer].numpy(), _template_r2(real[layer], ok), rtol=0, atol=1e-5
        )
    if family in REFUSES and 1 in REFUSES[family]:  # the scores are capped: no direct term
        assert torch.isnan(ps.direct).all()
        return
    ok = real[0] > -1e30
    d = real[0] - flat[0]
    want = [float(d[:, h][ok[:, h]].var() / real[0][:, h][ok[:, h]].var()) for h in range(H)]
    np.testing.assert_allclose(ps.direct[0].numpy(), want, rtol=1e-3, atol=1e-6)
    assert min(want) > 1e-3


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_scaled_and_tied_embeddings_are_read_as_the_model_reads_them(families, family):
    """Gemma scales its token embeddings by sqrt(d_model) inside the embedding and reads its answers
    off the same matrix: the bridge's hook_embed is the scaled vector, layer 0's input, so the
    content part of the decomposition is what layer 0 reads; where a bridge's hook_embed were
    not layer 0's input, the layer-0 split says so in one line instead of leaving a part out."""
    from probes.decomposition.terms import _check_layer0_input

    hf, model, _ = families(family)
    assert hf.config.tie_word_embeddings
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    toks = _pairs()[0][:2]
    _, cache = model.run_with_cache(toks, names_filter=["hook_embed", "blocks.0.hook_resid_pre"])
    e, resid = cache["hook_embed"], cache["blocks.0.hook_resid_pre"]
    table = hf.model.embed_tokens.weight[toks].detach()
    torch.testing.assert_close(e, table * (H * DH) ** 0.5, rtol=1e-6, atol=1e-6)
    assert torch.equal(e, resid)
    _check_layer0_input(model, dict(cache.cache_dict), e, None)  # as the bridge hooks it: fine
    unscaled = {"hook_embed": table, "blocks.0.hook_resid_pre": resid}
    with pytest.raises(ValueError, match="layer 0's input is not hook_embed .*scaled or normed"):
        _check_layer0_input(model, unscaled, table, None)


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "olmo2"])
def test_layer_0_reads_its_qk_norms_at_their_scale_in_the_forward(families, family):
    """With ln1's and the QK-norms' scales frozen at the real forward's, layer 0's path from its
    input to q and k is affine, as the content/offset split needs: the part of twice the content
    is twice the part of the content (not so with the QK-norms' scales left free; Qwen3's q/k
    biases make the offset a vector of its own)."""
    from probes.decomposition.reads import FROZEN_SCALES, layer0_qk

    _, model, _ = families(family)
    toks = _pairs()[0][:1]
    names = [*FROZEN_SCALES, "hook_embed"]
    _, cache = model.run_with_cache(toks, names_filter=names)
    frozen = {n: cache[n] for n in FROZEN_SCALES if n in cache.cache_dict}
    assert {n.split(".")[3] for n in frozen} >= {"q_norm", "k_norm"}
    c, ln = cache["hook_embed"], frozen.get("blocks.0.ln1.hook_scale")

    @torch.no_grad()
    def parts(extra):
        q0, k0 = layer0_qk(model, toks, None, torch.zeros_like(c), ln, 1, extra)
        q1, k1 = layer0_qk(model, toks, None, c, ln, 1, extra)
        q2, k2 = layer0_qk(model, toks, None, 2 * c, ln, 1, extra)
        return max(
            float((q2 - q0 - 2 * (q1 - q0)).abs().max()),
            float((k2 - k0 - 2 * (k1 - k0)).abs().max()),
        )

    assert parts(frozen) < 1e-4
    assert parts({}) > 1e-2


def test_a_sliding_layer_after_a_global_one_is_scored_over_its_own_mask(families):
    """Qwen2's layer 1 slides, its layer 0 does not: the template of layer 1 is fitted over the
    entries its window allows (the probe read layer 0's mask for every layer before)."""
    _, model, _ = families("qwen2")
    full = _pairs(16)[0]
    real = _scores_at(model, full)
    allowed = [int((s[0, 0] > -1e30).sum()) for s in real]
    assert allowed == [P * (P + 1) // 2, P * (P + 1) // 2 - (P - WINDOW) * (P - WINDOW + 1) // 2]
    ok0, ok1 = (real[0] > -1e30).expand_as(real[1]), real[1] > -1e30
    right = _template_r2(real[1], ok1)
    assert right.max() > 0.5  # the biases make q and k mostly position-only
    wrong = _template_r2(torch.where(ok1, real[1], 0.0), ok0)  # layer 0's mask, as read before
    got = positional_scores(model, full).scores[1].numpy()
    np.testing.assert_allclose(got, right, rtol=0, atol=1e-5)
    assert np.abs(got - wrong).max() > 1e-2


# ---------------------------------------------------------------------------- (d) rotation tables
def _config_theta(hf, layer: int, rotary_dim: int) -> torch.Tensor:
    """Each pair's frequency from the config: the layer type's RoPE base where the config gives
    each type its own, ``base ** (-2i / rotary_dim)``."""
    rope = hf.config.rope_parameters
    types = getattr(hf.config, "layer_types", None)
    if types and types[layer] in rope:
        rope = rope[types[layer]]
    i = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return rope["rope_theta"] ** (-i / rotary_dim)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_rotation_tables_of_every_layer_are_the_models_own(families, family):
    hf, model, _ = families(family)
    seen = {}
    names = [f"blocks.{i}.attn.hook_{t}" for i in range(L) for t in ("cos", "sin")]
    with torch.no_grad():
        model.bridge.run_with_hooks(
            torch.randint(3, V - 4, (1, 12)),
            fwd_hooks=[(n, lambda x, hook: seen.__setitem__(hook.name, x[0])) for n in names],
        )
    share = hf.config.rope_parameters.get("partial_rotary_factor", 1.0)
    thetas = []
    for layer in range(L):
        (span,) = model.encoding.rotary_spans(layer, 12)
        assert span.dim == int(DH * share) and span.halves
        cos, sin = seen[f"blocks.{layer}.attn.hook_cos"], seen[f"blocks.{layer}.attn.hook_sin"]
        half = cos.shape[-1] // 2
        assert (span.cos[:12] - cos[:, :half]).abs().max() <= 1e-6
        assert (span.sin[:12] - sin[:, :half]).abs().max() <= 1e-6
        torch.testing.assert_close(
            span.theta, _config_theta(hf, layer, span.dim), rtol=1e-5, atol=0
        )
        thetas.append(span.theta)
    if family == "gemma3":  # sliding layers turn at base 10,000, global ones at 1,000,000
        bases = [hf.config.rope_parameters[t]["rope_theta"] for t in hf.config.layer_types]
        assert bases == [10_000.0, 1_000_000.0]
        assert not torch.allclose(thetas[0], thetas[1])
    else:
        torch.testing.assert_close(thetas[0], thetas[1])


# ---------------------------------------------------------------------------- refusals
def test_a_rotation_the_tables_do_not_reproduce_is_refused_in_one_line(families):
    """Where a bridge rotated q/k otherwise than its rotary module's tables say (here: tables of
    another RoPE base put in its place), route shares and the decomposition refuse, naming it."""
    hf, _, out = families("mistral")
    model = BridgedModel(boot_bridge(out), answers=ANSWERS)
    wrong = type(hf.model.rotary_emb)(_with_base(hf.config, 500.0))
    model.encoding.__dict__["_model_rotary"] = wrong
    clean, corrupt, good, bad = _pairs()
    for probe in (
        lambda: route_shares(model, clean, corrupt, good, bad, n_bootstrap=0),
        lambda: logit_terms(model, clean, 1, 0),
    ):
        with pytest.raises(ValueError, match="do not reproduce layer 0's rotated q/k") as err:
            probe()
        assert "\n" not in str(err.value)
    assert math.isnan(float(positional_scores(model, clean).direct[0, 0]))


def _with_base(config, base: float):
    cfg = type(config).from_dict(config.to_dict())
    cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": base}
    return cfg


def test_scaled_rotary_tables_are_refused_in_one_line(tmp_path):
    """YaRN folds an attention scale into the cos/sin tables, which moved rotations and the
    per-frequency terms would count twice: refused, naming it."""
    cfg = _config("mistral")
    cfg.rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model = BridgedModel(boot_bridge(save_model_dir(hf, TOK, tmp_path / "m")), answers=ANSWERS)
    clean, corrupt, good, bad = _pairs()
    with pytest.raises(ValueError, match="cos/sin tables carry a scale .*YaRN or LongRoPE"):
        route_shares(model, clean, corrupt, good, bad, n_bootstrap=0)
    with pytest.raises(ValueError, match="^logit_terms: mistral: .*YaRN or LongRoPE"):
        logit_terms(model, clean, 0, 0)


# ---------------------------------------------------------------------------- the prompt path
@pytest.mark.parametrize("family", list(FAMILIES))
def test_prompts_longer_than_a_sliding_window_are_refused_in_one_line(families, family):
    hf, model, out = families(family)
    short = Induction(TOK, n_random=3, n_repeat=1).sample(4)  # BOS + 4 tokens
    long = Induction(TOK).sample(4)  # 19 tokens
    assert int(short.lengths.max()) <= WINDOW < int(long.lengths.max())
    assert family_accuracy(model.bridge, short).n == 4
    if family not in SLIDING:
        assert context_limit(out) == (64, "context (max_position_embeddings)")
        check_fits(model.bridge, long)
        return
    assert context_limit(out) == (WINDOW, "sliding window (sliding_window)")
    for source in (model.bridge, BridgedModel(model.bridge)):
        with pytest.raises(
            ValueError,
            match=f"^induction: prompts of up to 19 tokens are longer than the model's sliding "
            f"window \\(sliding_window\\) of {WINDOW}$",
        ):
            family_accuracy(source, long)


def test_a_sliding_window_that_is_off_is_no_limit():
    off = transformers.Qwen2Config(**COMMON, sliding_window=WINDOW, use_sliding_window=False)
    assert context_limit(off) == (64, "context (max_position_embeddings)")

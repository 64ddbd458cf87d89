"""A bridge's rotation tables at the prompts' length, and route shares on grouped key/value heads
(issue 47: SmolLM2 shares 3 key/value heads among 9 query heads and has an 8,192-token context).

References built here and not by the probe: the tables the bridge's attention sees in a forward
(``hook_cos``/``hook_sin``, what the encoding read before); each query head's route share from a
naive loop that recomputes that one head's attention scores with its query and its own copy of
the group's key rotated at σ, with angles from the config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bridge_env import sharp_bridge

from pe_interp.models.bridge.hf_arch import (
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel
from probes import positional_dominance, positional_scores, route_shares
from probes.common.inputs import position_permutation

V, PAD, P = 30, 0, 9
ANSWERS = [26, 27, 28, 29]
SHAPE = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_mlp": 40, "n_ctx": 16}
SHAPE |= {"d_vocab": V, "pad_id": PAD}
D = SHAPE["d_model"] // SHAPE["n_heads"]


def _pairs(n: int):
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 26, (n, P), generator=g)
    order = torch.stack([torch.randperm(P, generator=g) for _ in range(n)])
    good = torch.randint(0, 4, (n,), generator=g)
    return clean, clean.gather(1, order), good, (good + 1) % 4


def _ld(logits, good, bad):
    return (logits.gather(1, good[:, None])[:, 0] - logits.gather(1, bad[:, None])[:, 0]).double()


def _old_tables(bridge, n: int, layer: int):
    """What the encoding read before: the bridge's hook_cos/hook_sin in a forward of ``n`` tokens."""
    seen = {}
    hooks = [
        (f"blocks.{layer}.attn.hook_{c}", lambda x, hook, c=c: seen.__setitem__(c, x[0]))
        for c in ("cos", "sin")
    ]
    with torch.no_grad():
        bridge.run_with_hooks(torch.zeros(1, n, dtype=torch.long), fwd_hooks=hooks)
    return seen["cos"], seen["sin"]


@pytest.mark.parametrize("arch", ["llama", "gpt-neox"])
def test_rotation_tables_never_run_at_the_context_length(arch, tmp_path):
    """A 4,096-token context: reading every layer's spans, the decomposition's direct term and
    positional_scores run the rotary module once per distinct configuration at the prompts'
    length (grown once when a longer prompt comes), no forward reads the tables, and the tables
    equal the ones the attention sees in a forward, row for row."""
    shape = {**SHAPE, "n_ctx": 4096}
    if arch == "llama":
        shape["n_kv_heads"] = 2
    hf = build_hf_model(arch, seed=1, **shape)
    bridge = boot_bridge(save_model_dir(hf, word_tokenizer(V, PAD), tmp_path / "m"))
    model = BridgedModel(bridge, answers=ANSWERS)
    rotary = bridge.rotary_emb.original_component
    lengths, forwards = [], []

    def count(m, args, kwargs):  # the position_ids' length of every call
        lengths.append((args[1] if len(args) > 1 else kwargs["position_ids"]).shape[-1])

    rotary.register_forward_pre_hook(count, with_kwargs=True)
    bridge.blocks[0].register_forward_pre_hook(lambda m, a: forwards.append(1))
    spans = [model.encoding.rotary_spans(layer, 12) for layer in range(2)]
    assert lengths == [12] and not forwards  # one configuration, at the length asked
    assert all(s[0].cos.shape[0] == 12 for s in spans)
    assert model.encoding.rotary_spans(1, 7)[0].cos.shape[0] == 12  # a shorter one is cached
    assert lengths == [12]
    grown = model.encoding.rotary_spans(0, 20)[0]
    assert lengths == [12, 20] and grown.cos.shape[0] == 20
    for layer in range(2):
        cos, sin = _old_tables(bridge, 20, layer)
        half = cos.shape[-1] // 2
        span = model.encoding.rotary_spans(layer, 20)[0]
        assert (span.cos - cos[:, :half]).abs().max() <= 1e-6
        assert (span.sin - sin[:, :half]).abs().max() <= 1e-6
    assert forwards  # the counter sees a forward (the reference's)
    lengths.clear()
    tokens = torch.randint(1, 26, (8, P), generator=torch.Generator().manual_seed(2))
    ps = positional_scores(model, tokens)
    assert np.isfinite(ps.scores.numpy()).all()
    assert max(lengths) <= P  # the model's own forwards; the tables were cached at 20


def test_without_a_rotary_module_the_tables_come_from_one_forward_at_the_length_asked(tmp_path):
    hf = build_hf_model("llama", seed=1, **{**SHAPE, "n_ctx": 4096})
    bridge = boot_bridge(save_model_dir(hf, word_tokenizer(V, PAD), tmp_path / "m"))
    enc = BridgedModel(bridge, answers=ANSWERS).encoding
    enc.__dict__["_model_rotary"] = None  # as a bridge whose model has no rotary_emb
    lengths = []
    bridge.blocks[0].register_forward_pre_hook(lambda m, a: lengths.append(a[0].shape[:2]))
    spans = [enc.rotary_spans(layer, 12)[0] for layer in range(2)]
    assert lengths == [(1, 12)]  # one forward for every layer, at the length asked
    for layer, span in enumerate(spans):
        cos, sin = _old_tables(bridge, 12, layer)
        assert torch.equal(span.cos, cos[:, : cos.shape[-1] // 2])
        assert torch.equal(span.sin, sin[:, : sin.shape[-1] // 2])


def _naive_share(model, hf, clean, sigma, good, bad, ld_clean, effect, layer, head):
    """Query head ``head`` of ``layer`` sees σ, every other head (its group's included) the true
    positions: its scores recomputed from its query and a copy of its key head, both rotated at
    σ with angles from the config, where the causal mask allows."""
    c, kv = hf.config, model.kv_layout
    inv = 1.0 / c.rope_parameters["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = sigma.double()[..., None] * inv  # [n, P, D/2]
    cos, sin = ang.cos(), ang.sin()

    def at_sigma(x):  # [n, P, D] unrotated -> rotated at sigma (rotate_half pairs)
        y0, y1 = x[..., : D // 2].double(), x[..., D // 2 :].double()
        return torch.cat((y0 * cos - y1 * sin, y0 * sin + y1 * cos), -1)

    seen = {}

    def keep(name):
        return lambda x, hook: seen.__setitem__(name, x)

    def scores(s, hook):
        q = at_sigma(seen["q"][:, :, head])
        k = at_sigma(seen["k"][:, :, kv.kv_head(head)])
        mine = torch.einsum("nqd,nkd->nqk", q, k) * D**-0.5
        s = s.clone()
        s[:, head] = torch.where(s[:, head] > -1e30, mine.to(s.dtype), s[:, head])
        return s

    pre = f"blocks.{layer}.attn."
    hooks = [(pre + "hook_q", keep("q")), (pre + "hook_k", keep("k"))]
    hooks.append((pre + "hook_attn_scores", scores))
    with torch.no_grad():
        logits = model.run_with_hooks(clean, fwd_hooks=hooks)
    return float((ld_clean - _ld(logits, good, bad)).mean()) / effect


@pytest.mark.parametrize("n_kv", [2, 1], ids=["grouped", "multi-query"])
def test_route_shares_per_query_head_equal_a_naive_loop(n_kv, tmp_path):
    shape = {**SHAPE, "n_kv_heads": n_kv}
    hf, model, _ = sharp_bridge("llama", shape, 3, 12.0, tmp_path / "m", ANSWERS)
    assert model.kv_layout.n_kv_heads == n_kv
    clean, corrupt, good, bad = _pairs(16)
    r = route_shares(model, clean, corrupt, good, bad, n_bootstrap=0)
    sigma = position_permutation(clean, corrupt)
    with torch.no_grad():
        ld_clean = _ld(hf(clean).logits[:, -1][:, ANSWERS], good, bad)
        ld_all = _ld(hf(clean, position_ids=sigma).logits[:, -1][:, ANSWERS], good, bad)
    effect = float((ld_clean - ld_all).mean())
    assert abs(effect) > 1e-3 and r.effect == pytest.approx(effect, rel=1e-4, abs=1e-6)
    assert r.routes.all()
    naive = np.array(
        [
            [
                _naive_share(model, hf, clean, sigma, good, bad, ld_clean, effect, layer, head)
                for head in range(4)
            ]
            for layer in range(2)
        ]
    )
    assert np.abs(naive).max() > 1e-2  # the heads do carry position
    np.testing.assert_allclose(r.shares, naive, rtol=0, atol=1e-5)
    # moving one query head is not moving its group: the shares of a group's heads differ
    assert not np.allclose(r.shares[:, 0], r.shares[:, 1], atol=1e-4)


@pytest.mark.parametrize("n_kv", [2, 1], ids=["grouped", "multi-query"])
def test_a_grouped_bridge_with_one_planted_query_head_gets_a_yes_that_names_it(n_kv, tmp_path):
    """Every query projection is zero but that of query head 1 of layer 0, which shares its key
    head with head 0 (and, multi-query, with every head): only head 1's logits depend on
    position, so it alone has a share, and the verdict names it."""
    planted, group = (0, 1), 4 // n_kv
    hf = build_hf_model("llama", seed=3, **{**SHAPE, "n_kv_heads": n_kv})
    with torch.no_grad():
        for name, p in hf.named_parameters():
            layer = int(name.split(".")[2]) if ".layers." in name else None
            if name.endswith("q_proj.weight"):
                for h, rows in enumerate(p.view(4, D, -1)):
                    rows.mul_(20.0 if (layer, h) == planted else 0.0)
            elif name.endswith("k_proj.weight"):
                for g, rows in enumerate(p.view(n_kv, D, -1)):
                    rows.mul_(20.0 if (layer, g) == (0, planted[1] // group) else 0.0)
            elif name.endswith("lm_head.weight"):
                p.mul_(400.0)  # a positional effect well above the criterion's 0.1 logits
    model = BridgedModel(
        boot_bridge(save_model_dir(hf, word_tokenizer(V, PAD), tmp_path / "m")), answers=ANSWERS
    )
    clean, corrupt, good, bad = _pairs(64)  # a verdict needs >= 59 pairs
    r = route_shares(model, clean, corrupt, good, bad, n_bootstrap=200)
    assert abs(r.effect) > 0.1
    assert r.shares[planted] == pytest.approx(1.0, abs=1e-6)
    assert np.count_nonzero(np.abs(r.shares) > 1e-9) == 1
    verdict = positional_dominance(r)
    assert verdict.verdict == "yes" and verdict.top == "L0H1"

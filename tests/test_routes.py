"""Planted position (issue 36): encodings restricted to heads and layers, silent heads, the
positional route shares against a naive per-example reference, and the verdicts decided on
intervals (the positional deposit, the single-head deposit, layer concentration)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.kernels.rope import apply_rope
from pe_interp.tasks import CountTask, DistanceTask
from probes.ablation import AblationResult
from probes.deposit.decision import decide_concentration, decide_single
from probes.deposit.positional import positional_dominance
from probes.routes.shares import (
    RouteShares,
    position_permutation,
    position_routes,
    route_shares,
)

TASK = DistanceTask(d_vocab=40, max_between=8, max_side=3, max_len=16, seed=0)
SHAPE = dict(
    n_layers=2,
    d_model=32,
    n_heads=4,
    d_mlp=32,
    d_vocab=TASK.d_vocab,
    n_ctx=TASK.max_len,
    n_classes=TASK.n_classes,
)


def model(encoding, scale=30.0, **kw):
    """A random model with weights large enough that position moves its logits by whole units."""
    m = HookedPETransformer(ModelConfig(encoding=encoding, **{**SHAPE, **kw}))
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    return m.eval()


def pairs(n=24, seed=3):
    return TASK.counterfactuals(n, kind="position", seed=seed)


# ---- restricting an encoding to heads and layers ---------------------------------------------------
def test_restricted_rope_rotates_only_its_heads_in_its_layers():
    m = model("rope(heads=(1,), layers=(1,))")
    tokens = TASK.sample(4, seed=1).tokens
    _, cache = m.run_with_cache(tokens)
    assert torch.equal(cache["blocks.0.attn.hook_rot_q"], cache["blocks.0.attn.hook_q"])
    q, rot = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_rot_q"]
    ref = apply_rope(q, m.encoding.inner.cos, m.encoding.inner.sin)
    assert torch.equal(rot[:, :, [0, 2, 3]], q[:, :, [0, 2, 3]])
    torch.testing.assert_close(rot[:, :, 1], ref[:, :, 1], rtol=0, atol=1e-6)
    assert position_routes(m)[1].tolist() == [[False] * 4, [False, True, False, False]]


@pytest.mark.parametrize(
    "encoding, layer, heads",
    [
        ("alibi(heads=(2,))", 0, [2]),
        ("t5(layers=(1,))", 1, [0, 1, 2, 3]),
        ("alibi(heads=(0, 3), layers=(0,))", 0, [0, 3]),
    ],
)
def test_restricted_biases_act_only_on_their_heads_and_layers(encoding, layer, heads):
    m = model(encoding)
    _, cache = m.run_with_cache(TASK.sample(2, seed=1).tokens)
    bias = cache[f"blocks.{layer}.attn.hook_pos_bias"]
    others = [h for h in range(4) if h not in heads]
    assert bias[others].abs().max() == 0 if others else True
    assert all(bias[h].abs().max() > 0 for h in heads)
    other_layer = 1 - layer
    if "layers" in encoding:
        assert f"blocks.{other_layer}.attn.hook_pos_bias" not in cache  # no bias at all there
    expect = np.zeros((2, 4), bool)
    expect[layer, heads] = True
    if "layers" not in encoding:
        expect[other_layer, heads] = True
    assert (position_routes(m)[1] == expect).all()


@pytest.mark.parametrize(
    "encoding, message",
    [
        ("sinusoidal(heads=(0,))", "heads= has no meaning: it enters the residual stream once"),
        ("learned(layers=(1,))", "layers= has no meaning"),
        ("rope(layers=(2,))", r"layers must be distinct layer indices in 0..1, got \(2,\)"),
        ("alibi(heads=(1, 1))", "heads must be distinct head indices"),
        ("t5(heads=())", "heads must be distinct head indices"),
        ("alibi(rows=(1,))", "unknown parameter 'rows'; allowed: slopes, heads, layers"),
    ],
)
def test_a_restriction_without_meaning_or_out_of_range_is_one_line(encoding, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(encoding=encoding, **SHAPE)


def test_a_restricted_spec_round_trips_through_the_config():
    cfg = ModelConfig(
        encoding="sinusoidal+alibi(heads=(2,), layers=(1,))", silent_heads=[[1, 0], "0:3"], **SHAPE
    )
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.silent_heads == ((0, 3), (1, 0))
    assert str(cfg.encoding[1]) == "alibi(heads=(2,),layers=(1,))"


# ---- each planting, proved: with the planted heads zeroed the model is blind to order ---------------
FAMILIES = {
    "one_route": ("rope(heads=(3,), layers=(0,))", [(0, 3)]),
    "two_routes": ("rope(heads=(0, 2), layers=(0,))", [(0, 0), (0, 2)]),
    "deep_route": ("rope(heads=(1,), layers=(1,))", [(1, 1)]),
    "alibi_route": ("alibi(heads=(2,), layers=(1,))", [(1, 2)]),
    "no_route": ("nope", []),
}


def _zeroed(m, heads):
    hooks = []
    for layer in range(m.cfg.n_layers):
        hs = [h for a, h in heads if a == layer]
        if hs:

            def zero(z, hook, hs=hs):
                z = z.clone()
                z[:, :, hs] = 0
                return z

            hooks.append((f"blocks.{layer}.attn.hook_z", zero))
    return hooks


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_planting_is_the_only_way_position_gets_in(family):
    encoding, planted = FAMILIES[family]
    m = model(encoding)
    batch = TASK.sample(16, seed=5)
    gen = torch.Generator().manual_seed(0)
    perm = batch.tokens.clone()
    for i in range(len(batch)):  # permute each row's real tokens; pads stay where they are
        n = int(batch.pad_mask[i].sum())
        perm[i, :n] = batch.tokens[i, torch.randperm(n, generator=gen)]
    with torch.no_grad(), m.hooks(fwd_hooks=_zeroed(m, planted)):
        blind, blind_perm = m(batch.tokens, batch.pad_mask), m(perm, batch.pad_mask)
    torch.testing.assert_close(blind, blind_perm, rtol=0, atol=1e-4)
    if planted:
        with torch.no_grad():
            assert (m(batch.tokens, batch.pad_mask) - m(perm, batch.pad_mask)).abs().max() > 1e-2


def test_silent_heads_write_nothing_and_stay_silent_through_training(tmp_path):
    import pe_interp

    silent = [(0, h) for h in (0, 2, 3)] + [(1, h) for h in range(4)]
    pe_interp.train(
        task="distance",
        encoding="rope(heads=(1,), layers=(0,))",
        preset="smoke",
        seed=0,
        out=tmp_path / "r",
        silent_heads=silent,
        n_heads=4,
        progress=False,
    )
    m = pe_interp.load_run(tmp_path / "r").model
    for layer, head in silent:
        attn = m.blocks[layer].attn
        assert (
            attn.W_V[head].abs().max() == 0
            and attn.b_V[head].abs().max() == 0
            and attn.W_O[head].abs().max() == 0
        )
    assert m.blocks[0].attn.W_O[1].abs().max() > 0
    with pytest.raises(
        ValueError, match=r"silent_heads: \(2, 0\) is not a head of 2 layers x 4 heads"
    ):
        ModelConfig(silent_heads=[(2, 0)], **SHAPE)


# ---- route shares -------------------------------------------------------------------------------
def _naive_ld(m, p, unit, sigma):
    """ld of each clean example when ``unit`` (``(l, h)``, "embed" or "all") sees ``sigma``: one
    example at a time, each rotated head turned back by its angles at 0..n-1 (a rotation by -i)
    and forward again at the moved positions."""
    enc, out = m.encoding, []
    for i in range(len(p.clean)):
        tok, mask, s = p.clean.tokens[i : i + 1], p.clean.pad_mask[i : i + 1], sigma[i]
        hooks = []
        for layer in range(m.cfg.n_layers):
            heads = [h for h in range(m.cfg.n_heads) if unit == "all" or unit == (layer, h)]
            if not heads:
                continue

            def rot(x, hook, heads=heads, layer=layer, s=s):
                x, n = x.clone(), x.shape[1]
                for span in enc.rotary_spans(layer) or ():
                    back = apply_rope(x, span.cos[:n], -span.sin[:n], span.start)
                    moved = apply_rope(back, span.cos[s], span.sin[s], span.start)
                    for h in heads:
                        if span.rotates_head(h):
                            x[:, :, h, span.start : span.start + span.dim] = moved[
                                :, :, h, span.start : span.start + span.dim
                            ]
                return x

            if enc.rotates:
                hooks += [
                    (f"blocks.{layer}.attn.hook_rot_q", rot),
                    (f"blocks.{layer}.attn.hook_rot_k", rot),
                ]
            if enc.has_bias:

                def bias(b, hook, heads=heads, s=s):
                    b = b.clone()
                    for h in heads:
                        b[h] = b[h][s][:, s]
                    return b

                hooks.append((f"blocks.{layer}.attn.hook_pos_bias", bias))
        if unit in ("embed", "all") and enc.residual(1) is not None:
            hooks.append(("hook_pos_embed", lambda x, hook, s=s: x[:, s]))
        with torch.no_grad(), m.hooks(fwd_hooks=hooks):
            logits = m(tok, mask)
        out.append(float(logits[0, p.clean.labels[i]] - logits[0, p.corrupt.labels[i]]))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize(
    "encoding",
    [
        "rope",
        "alibi",
        "t5",
        "sinusoidal+rope",
        "decoupled_rope(heads=(1, 2))",
        "rope(heads=(3,), layers=(1,))+t5(layers=(0,))",
    ],
)
def test_route_shares_match_a_naive_per_example_loop(encoding):
    m, p = model(encoding, scale=8.0), pairs()
    r = route_shares(
        m,
        p.clean.tokens,
        p.corrupt.tokens,
        p.clean.labels,
        p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
        n_bootstrap=0,
    )
    sigma = position_permutation(p.clean.tokens, p.corrupt.tokens)
    base = _naive_ld(m, p, None, sigma)
    denom = (base - _naive_ld(m, p, "all", sigma)).mean()
    assert r.effect == pytest.approx(float(denom), rel=1e-4, abs=1e-5)
    for name, share, _, _ in r.units():
        unit = name if name == "embed" else (int(name[1]), int(name.split("H")[1]))
        expect = float((base - _naive_ld(m, p, unit, sigma)).mean() / denom)
        assert share == pytest.approx(expect, rel=1e-3, abs=1e-4), name
    # bidirectional attention and mean pooling are blind to order: every route moved = the counterfactual
    assert r.identity_gap < 1e-4 * max(1.0, abs(r.effect))


def test_a_single_route_carries_everything_and_a_blind_head_nothing():
    m, p = model("rope(heads=(2,), layers=(1,))"), pairs(64)
    r = route_shares(
        m,
        p.clean.tokens,
        p.corrupt.tokens,
        p.clean.labels,
        p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
        n_bootstrap=200,
    )
    assert r.routes.sum() == 1 and r.shares[1, 2] == pytest.approx(1.0, abs=1e-5)
    assert np.count_nonzero(r.shares) == 1
    assert r.effect == pytest.approx(r.counterfactual_effect, abs=1e-4)
    verdict = positional_dominance(r)
    assert verdict.verdict == "yes" and verdict.top == "L1H2"
    blind = model("nope")
    r0 = route_shares(
        blind,
        p.clean.tokens,
        p.corrupt.tokens,
        p.clean.labels,
        p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
    )
    assert (
        positional_dominance(r0).verdict == "no"
        and "no positional effect" in positional_dominance(r0).why
    )


def test_an_absolute_encodings_single_route_is_no_head_deposit():
    m, p = model("sinusoidal", scale=10.0), pairs(32)
    r = route_shares(
        m,
        p.clean.tokens,
        p.corrupt.tokens,
        p.clean.labels,
        p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
        n_bootstrap=100,
    )
    assert r.routes.sum() == 0 and r.embed == pytest.approx(1.0, abs=1e-5)
    verdict = positional_dominance(r)
    assert verdict.verdict == "no" and verdict.top == "embed" and "enters no head" in verdict.why


def test_route_shares_refuse_pairs_that_are_not_position_only():
    m = model("rope")
    p = TASK.counterfactuals(8, kind="both", seed=1)
    with pytest.raises(ValueError, match="not the same tokens moved"):
        route_shares(
            m,
            p.clean.tokens,
            p.corrupt.tokens,
            p.clean.labels,
            p.corrupt.labels,
            pad_mask=p.clean.pad_mask,
        )
    count = CountTask(d_vocab=40, n_triggers=3, max_count=6, length=12)
    mc = HookedPETransformer(
        ModelConfig(encoding="rope", **{**SHAPE, "n_ctx": 12, "n_classes": count.n_classes})
    )
    pc = count.counterfactuals(8, kind="position", seed=1)
    with pytest.raises(ValueError, match="position changes no answer here"):
        route_shares(
            mc,
            pc.clean.tokens,
            pc.corrupt.tokens,
            pc.clean.labels,
            pc.corrupt.labels,
            pad_mask=pc.clean.pad_mask,
        )


def _shares(values, lo, hi, effect=2.0):
    routes = np.ones((1, len(values)), bool)
    return RouteShares(
        np.array([values], float),
        np.array([lo], float),
        np.array([hi], float),
        routes,
        None,
        None,
        effect,
        (effect - 0.1, effect + 0.1),
        effect,
        0.0,
        500,
        1000,
        0.95,
        0,
    )


@pytest.mark.parametrize(
    "values, lo, hi, verdict",
    [
        ([0.9, 0.01, -0.02], [0.8, -0.01, -0.04], [1.0, 0.03, 0.0], "yes"),
        ([0.4, 0.3, 0.3], [0.3, 0.2, 0.2], [0.48, 0.4, 0.4], "no"),  # top below 50%
        ([0.9, 0.2, 0.0], [0.8, 0.1, -0.01], [1.0, 0.3, 0.01], "no"),  # another route above 5%
        ([0.55, 0.03, 0.0], [0.45, -0.01, -0.01], [0.65, 0.07, 0.01], "undecided"),
    ],
)
def test_positional_dominance_decides_on_the_intervals(values, lo, hi, verdict):
    assert positional_dominance(_shares(values, lo, hi)).verdict == verdict


# ---- single-head and concentration verdicts on their intervals -----------------------------------------
def _grid(drops, lo, hi, n=1000):
    drops, lo, hi = (np.array(x, float) for x in (drops, lo, hi))
    return AblationResult(
        baseline=0.9,
        values=0.9 - drops,
        drops=drops,
        ci_low=lo,
        ci_high=hi,
        method="zero",
        metric="accuracy",
        higher_is_better=True,
        n_examples=n,
        n_layers=drops.shape[0],
        n_heads=drops.shape[1],
        n_bootstrap=1000,
    )


def test_single_head_verdicts_yes_no_and_undecided_with_what_would_decide():
    yes = _grid(
        [[0.6, 0.01], [0.0, -0.02]], [[0.55, -0.01], [-0.01, -0.04]], [[0.65, 0.03], [0.01, 0.0]]
    )
    assert decide_single(yes).verdict == "yes"
    no = _grid(
        [[0.3, 0.01], [0.0, 0.02]], [[0.25, -0.01], [-0.01, 0.0]], [[0.35, 0.03], [0.01, 0.04]]
    )
    assert decide_single(no).verdict == "no" and "reaches 50" in decide_single(no).why
    two = _grid(
        [[0.6, 0.1], [0.08, 0.0]], [[0.55, 0.07], [0.06, -0.01]], [[0.65, 0.13], [0.1, 0.01]]
    )
    assert decide_single(two).verdict == "no"
    open_ = _grid(
        [[0.52, 0.01], [0.0, 0.0]],
        [[0.44, -0.01], [-0.01, -0.01]],
        [[0.60, 0.03], [0.01, 0.01]],
        n=128,
    )
    d = decide_single(open_)
    # half-width 0.08 at a gap of 0.02 from the bar: 16x the examples
    assert d.verdict == "undecided" and d.need == 128 * 16 and "need ≥ 2,048" in d.text()


def test_layer_concentration_verdicts_decide_the_20_point_bar_on_the_interval():
    yes = _grid([[0.5, 0.05, 0.0]], [[0.45, 0.03, -0.01]], [[0.55, 0.07, 0.01]])
    assert decide_concentration(yes, 0).verdict == "yes"
    open_ = _grid([[0.21, 0.01, 0.0]], [[0.15, 0.0, -0.01]], [[0.27, 0.02, 0.01]], n=200)
    assert decide_concentration(open_, 0).verdict == "undecided"
    spread = _grid([[0.5, 0.45, 0.4]], [[0.45, 0.4, 0.35]], [[0.55, 0.5, 0.45]])
    assert decide_concentration(spread, 0).verdict == "no"


@pytest.mark.parametrize("encoding", ["rope", "rope(heads=(3,), layers=(1,))"])
def test_the_direct_term_is_the_rope_logit_minus_the_same_weights_without_rope(encoding):
    from probes import positional_scores

    m = model(encoding, scale=4.0)
    blind = HookedPETransformer(ModelConfig(encoding="nope", **SHAPE)).eval()
    blind.load_state_dict(m.state_dict())
    b = TASK.sample(12, seed=2)
    ps = positional_scores(m, b.tokens, pad_mask=b.pad_mask)
    names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in range(2)]
    _, with_rope = m.run_with_cache(b.tokens, b.pad_mask, names_filter=names)
    # the same residual into each layer, so that only the rotation differs
    for layer in range(2):
        _, resid = m.run_with_cache(
            b.tokens, b.pad_mask, names_filter=f"blocks.{layer}.hook_resid_pre"
        )
        _, without = blind.run_with_cache(
            b.tokens,
            b.pad_mask,
            start_at_layer=layer,
            residual=resid[f"blocks.{layer}.hook_resid_pre"],
            names_filter=names[layer],
        )
        s, u = with_rope[names[layer]].double(), without[names[layer]].double()
        ok = torch.isfinite(s) & b.pad_mask[:, None, :, None] & b.pad_mask[:, None, None, :]
        for h in range(4):
            d, t = (s - u)[:, h][ok[:, h]], s[:, h][ok[:, h]]
            assert float(ps.direct[layer, h]) == pytest.approx(
                float(d.var(unbiased=False) / t.var(unbiased=False)), rel=1e-4, abs=1e-9
            )
    if "heads" in encoding:
        assert ps.entry() == (1, 3) and int((ps.direct > 0).sum()) == 1


@pytest.mark.parametrize(
    "encoding, message",
    [
        ("rope+rope", "applies 'rope' twice"),
        ("rope(heads=(0,))+rope(heads=(1,), base=500)", "applies 'rope' twice"),
        ("nope+rope", "joins 'nope'"),
        ('[{"name": "alibi"}, "sinusoidal", "alibi"]', "applies 'alibi' twice"),
    ],
)
def test_a_composition_that_repeats_or_contradicts_itself_is_refused(
    encoding, message, tmp_path, capsys
):
    from pe_interp.cli import main

    with pytest.raises(ValueError, match=message):
        ModelConfig(encoding=encoding, **SHAPE)
    assert (
        main(["train", "--preset", "smoke", "--encoding", encoding, "--out", str(tmp_path / "r")])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        message.split("'")[0] in err
        and len(err.strip().splitlines()) == 1
        and not (tmp_path / "r").exists()
    )

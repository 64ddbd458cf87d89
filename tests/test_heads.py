"""Heads ranked along the ablation path (``probes.ablation.ranking``) against exact ablation, and
``ablate_heads(engine="attribution")``'s verification; ``find_deposits`` refuses a partial grid."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import inputs, random_model

from probes import ablate_heads, find_deposits
from probes.ablation import Attribution
from probes.ablation.ranking import rank_heads
from probes.common.metrics import accuracy_per_example


def margin(logits, labels):
    own = logits.gather(1, labels[:, None])[:, 0]
    return own - logits.scatter(1, labels[:, None], float("-inf")).max(1).values


def logprob(logits, labels):
    return logits.log_softmax(-1).gather(1, labels[:, None])[:, 0]


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_one_head_per_layer_path_integrates_to_the_exact_ablation(method):
    """With one head per layer, the "layer" path moves one head alone: integrated finely (96
    Gauss-Legendre nodes: this random model varies fast in layer 0), every
    example's log-probability change is the exact one (a smooth function of the head's scale;
    the margin has kinks where the runner-up class changes, so quadrature only approximates it)."""
    model = random_model("rope", n_heads=1, d_model=8, init_std=0.2)
    tokens, labels, pad = inputs()
    exact = ablate_heads(
        model,
        tokens,
        labels,
        pad_mask=pad,
        method=method,
        metric=logprob,
        per_example=True,
        n_bootstrap=0,
    )
    est = rank_heads(
        model, tokens, labels, pad, method=method, surrogate="logprob", steps=96, path="layer"
    )
    want = exact.per_example[:, 0] - exact.baseline_per_example[None]  # [layer, example]
    np.testing.assert_allclose(est["per_example_change"][:, :, 0].T, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(est["estimate"][:, 0], exact.drops[:, 0], rtol=1e-5, atol=1e-6)


def test_the_loss_estimate_is_the_exact_rise_of_the_loss():
    """The "loss" surrogate is signed as ablate_heads' loss drops (a rise of the loss when a head
    is removed is a positive drop): one head per layer, integrated finely, equals them."""
    model = random_model("rope", n_heads=1, d_model=8, init_std=0.2)
    tokens, labels, pad = inputs()
    exact = ablate_heads(model, tokens, labels, pad_mask=pad, metric="loss", n_bootstrap=0)
    est = rank_heads(model, tokens, labels, pad, surrogate="loss", steps=96, path="layer")
    assert np.abs(exact.drops).max() > 1e-3
    np.testing.assert_allclose(est["estimate"][:, 0], exact.drops[:, 0], rtol=1e-5, atol=1e-6)
    assert est["baseline"] == pytest.approx(exact.baseline, rel=1e-6)


def test_accuracy_is_the_share_of_margins_that_cross_zero():
    """The accuracy estimate counts flips of each example's margin plus its integrated change:
    with the exact margin changes that rule gives the exact accuracy drops."""
    model = random_model("rope")
    tokens, labels, pad = inputs(40)
    acc = ablate_heads(model, tokens, labels, pad_mask=pad, n_bootstrap=0)
    m = ablate_heads(
        model, tokens, labels, pad_mask=pad, metric=margin, per_example=True, n_bootstrap=0
    )
    base = m.baseline_per_example
    flips = (base > 0).mean() - (m.per_example > 0).mean(-1)
    np.testing.assert_allclose(flips, acc.drops, atol=1e-12)
    est = rank_heads(model, tokens, labels, pad, surrogate="accuracy", steps=3)
    assert est["baseline"] == pytest.approx(acc.baseline)
    after = (base[None, None] + np.moveaxis(est["per_example_change"], 0, -1)) > 0
    np.testing.assert_allclose(est["estimate"], (base > 0).mean() - after.mean(-1), atol=1e-12)


@pytest.mark.parametrize(
    "path,a0,double,rel,abs_",
    [("joint", 0.5, False, 1e-5, 1e-8), ("clean", 1.0, True, 1e-6, 1e-9)],
)
def test_one_node_is_the_derivative_of_the_scaled_model(path, a0, double, rel, abs_):
    """One node: each head's estimate is minus the derivative of the mean metric in its own
    output scale, with every head at 1/2 ("joint") or live at 1 ("clean", AtP), taken here by
    finite differences (drop = -(-d) over [0, 1] at one node); "clean" takes no more nodes."""
    model = random_model("t5")
    model = model.double() if double else model
    tokens, labels, pad = inputs(6)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    est = rank_heads(model, tokens, labels, pad, surrogate="logprob", steps=1, path=path)
    est = est["estimate"]

    def mean_logprob(layer, head, eps):
        def hook(z, hook):
            scale = torch.full((H,), a0, dtype=z.dtype)
            if int(hook.name.split(".")[1]) == layer:
                scale[head] += eps
            return z * scale[None, None, :, None]

        with torch.no_grad():
            logits = model.run_with_hooks(
                tokens, pad, fwd_hooks=[(f"blocks.{i}.attn.hook_z", hook) for i in range(L)]
            )
        return float(logits.log_softmax(-1).gather(1, labels[:, None]).mean())

    for layer in range(L):
        for h in range(H):
            d = (mean_logprob(layer, h, 1e-5) - mean_logprob(layer, h, -1e-5)) / 2e-5
            assert est[layer, h] == pytest.approx(d, rel=rel, abs=abs_)
    if path == "clean":
        with pytest.raises(ValueError, match="steps=1"):
            rank_heads(model, tokens, labels, pad, steps=2, path="clean")


def test_attribution_engine_reports_the_agreement_it_saw():
    model = random_model("rope")
    tokens, labels, pad = inputs(40)
    exact = ablate_heads(model, tokens, labels, pad_mask=pad, n_bootstrap=0)
    ranked = ablate_heads(
        model, tokens, labels, pad_mask=pad, engine=Attribution(verify_top=4), n_bootstrap=0
    )
    v = ranked.meta["verification"]
    heads = [tuple(h) for h in v["heads"]]
    assert len(heads) == 4 and heads == [tuple(h) for h in ranked.meta["verified"]]
    est = np.array(ranked.meta["attribution"])
    assert v["estimate"] == [pytest.approx(est[h]) for h in heads]
    assert v["exact"] == [pytest.approx(exact.drops[h]) for h in heads]
    assert v["max_abs_error"] == pytest.approx(
        max(abs(a - b) for a, b in zip(v["estimate"], v["exact"]))
    )
    best_est, best_exact = (
        max(heads, key=lambda h: est[h]),
        max(heads, key=lambda h: exact.drops[h]),
    )
    assert v["top_agrees"] == (best_est == best_exact)
    assert ranked.meta["stand_in"] == "accuracy" and ranked.meta["steps"] == 4
    assert np.isnan(ranked.drops).sum() == exact.drops.size - 4


def test_find_deposits_refuses_a_partial_grid():
    model = random_model("rope")
    tokens, labels, pad = inputs(20)
    ranked = ablate_heads(
        model, tokens, labels, pad_mask=pad, engine=Attribution(verify_top=3), n_bootstrap=0
    )
    with pytest.raises(ValueError, match="partial grid") as e:
        find_deposits(ranked)
    assert "\n" not in str(e.value)
    some = ablate_heads(model, tokens, labels, pad_mask=pad, heads=[0], n_bootstrap=0)
    with pytest.raises(ValueError, match="partial grid"):
        find_deposits(some)
    one_layer = ablate_heads(model, tokens, labels, pad_mask=pad, layers=[1], n_bootstrap=0)
    assert [s.layer for s in find_deposits(one_layer).layers] == [1]  # whole layers are fine
    assert accuracy_per_example  # the grid's metric

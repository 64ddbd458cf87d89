"""``rank_heads(path="hvp")``: the second-order term from Hessian-vector products against
``torch.autograd.functional.hvp`` and a double finite difference, exact on a metric quadratic in
the heads' scales; ``Attribution(path="hvp")`` verifies the flagged heads (Screen-Flag-Fix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import inputs, random_model
from torch.nn.attention import SDPBackend, sdpa_kernel

from probes import ablate_heads
from probes.ablation import Attribution
from probes.ablation.ranking import hvp_probes, rank_heads


def logprob(logits, labels):
    return logits.log_softmax(-1).gather(1, labels[:, None])[:, 0]


def scaled_logprob(model, tokens, pad, labels, scale):
    """Per example, the log-probability with head ``h`` of layer ``l`` scaled by
    ``scale[:, l, h]`` (zero ablation at 0): the function ``rank_heads`` differentiates."""

    def hook(z, hook):
        return z * scale[:, hook.layer()][:, None, :, None]

    L = model.cfg.n_layers
    out = model.run_with_hooks(
        tokens, pad, fwd_hooks=[(f"blocks.{i}.attn.hook_z", hook) for i in range(L)]
    )
    return logprob(out, labels)


def curvature(model, tokens, labels, pad, steps, seed=0, batch_size=None):
    """``q`` per example ``[n, L, H]``: twice what ``"hvp"`` adds to AtP's change."""
    kw = dict(surrogate="logprob", seed=seed)
    second = rank_heads(
        model, tokens, labels, pad, steps=steps, path="hvp", batch_size=batch_size, **kw
    )
    first = rank_heads(model, tokens, labels, pad, steps=1, path="clean", **kw)
    return 2 * (second["per_example_change"] - first["per_example_change"]), second


@pytest.mark.parametrize("steps,batch_size", [(1, None), (4, None), (4, 2)])
def test_the_hvp_term_is_torch_hvp_along_the_probes(steps, batch_size):
    """Per example and head, ``q_h`` is the probe's ``v_h (H v)_h`` summed over probes, with
    ``H v`` from ``torch.autograd.functional.hvp`` of the scaled model at every head live (also
    with 2 rows a pass: one example, two probes at a time)."""
    model = random_model("rope")
    tokens, labels, pad = inputs(6)
    n, L, H = len(tokens), model.cfg.n_layers, model.cfg.n_heads
    q, _ = curvature(model, tokens, labels, pad, steps, seed=3, batch_size=batch_size)
    probes = hvp_probes(n, L, H, steps, 3)
    f = lambda a: scaled_logprob(model, tokens, pad, labels, a).sum()  # noqa: E731
    want = torch.zeros(n, L, H, dtype=torch.float64)
    for v in probes:  # SDPA's math kernel: the fused one has no double backward
        with sdpa_kernel(SDPBackend.MATH):
            _, hv = torch.autograd.functional.hvp(f, torch.ones(n, L, H, dtype=torch.float64), v)
        want += v * hv
    assert np.abs(q).max() > 1e-2  # a curvature to get right
    np.testing.assert_allclose(q, want.numpy(), rtol=1e-9, atol=1e-12)
    assert sorted(probes.abs().sum(0).ravel().tolist()) == [1.0] * (n * L * H)  # one probe each


def test_one_probe_per_head_is_the_diagonal_by_finite_differences():
    """With ``steps = n_layers x n_heads`` every probe holds one head: ``q_h`` is the exact second
    derivative in the head's scale, a double central difference of the scaled model (eps 1e-3,
    float64: error ~ eps^2)."""
    model = random_model("rope")
    tokens, labels, pad = inputs(6)
    n, L, H = len(tokens), model.cfg.n_layers, model.cfg.n_heads
    q, _ = curvature(model, tokens, labels, pad, L * H)
    eps = 1e-3
    with torch.no_grad():
        at = lambda a: scaled_logprob(model, tokens, pad, labels, a).numpy()  # noqa: E731
        one = torch.ones(n, L, H, dtype=torch.float64)
        for layer in range(L):
            for h in range(H):
                step = torch.zeros_like(one)
                step[:, layer, h] = eps
                d2 = (at(one + step) - 2 * at(one) + at(one - step)) / eps**2
                np.testing.assert_allclose(q[:, layer, h], d2, rtol=1e-4, atol=1e-6)
    assert np.abs(q).max() > 1e-2


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_on_a_quadratic_metric_the_second_order_estimate_is_the_exact_drop(method):
    """One attention-only layer with no final norm: the pooled logits are affine in every head's
    scale, so a metric quadratic in the logits is quadratic in the scales, and the second-order
    estimate (one head per probe) equals the exact ablation drop; AtP alone does not."""
    model = random_model("rope", n_layers=1, n_heads=4, d_mlp=0, final_norm=False)
    tokens, labels, pad = inputs(8)

    def quad(logits, labels):
        return -((logits - 0.3) ** 2).sum(-1) + 2 * logits.gather(1, labels[:, None])[:, 0]

    exact = ablate_heads(
        model, tokens, labels, pad_mask=pad, method=method, metric=quad, n_bootstrap=0
    )
    est = rank_heads(model, tokens, labels, pad, method=method, surrogate=quad, steps=4, path="hvp")
    np.testing.assert_allclose(est["estimate"], exact.drops, rtol=1e-9, atol=1e-12)
    assert np.abs(est["first_order"] - exact.drops).max() > 1e-2  # the correction did something
    second = est["estimate"] - est["first_order"]
    np.testing.assert_allclose(est["second_order"], second, rtol=1e-9, atol=1e-12)
    rel = np.abs(second) / np.abs(est["first_order"])
    np.testing.assert_allclose(est["reliability"], rel, rtol=1e-12)
    np.testing.assert_array_equal(est["flagged"], rel > 1)


def test_screen_flag_fix_verifies_the_top_and_the_flagged_heads():
    """``Attribution(path="hvp")``: the top ``verify_top`` by the second-order estimate, then the
    flagged heads by their second-order term (all, or ``verify_flagged``), each with its exact drop."""
    model = random_model("rope", n_heads=4)
    tokens, labels, pad = inputs(24)
    kw = dict(pad_mask=pad, metric="loss", n_bootstrap=0)
    grid = ablate_heads(model, tokens, labels, **kw)
    est = rank_heads(model, tokens, labels, pad, surrogate="loss", steps=2, path="hvp")
    flagged = [tuple(h) for h in np.argwhere(est["flagged"])]
    assert 0 < len(flagged) < grid.drops.size - 2  # some flagged, not all: the test has a choice
    for cap in (None, 1):
        res = ablate_heads(
            model, tokens, labels, engine=Attribution(2, "hvp", 2, verify_flagged=cap), **kw
        )
        top = sorted(np.ndindex(grid.drops.shape), key=lambda h: -est["estimate"][h])[:2]
        rest = [h for h in flagged if h not in top]
        rest = sorted(rest, key=lambda h: -abs(est["second_order"][h]))[: cap or len(rest)]
        assert [tuple(h) for h in res.meta["verified"]] == top + rest
        assert [tuple(h) for h in res.meta["verified_flagged"]] == rest
        assert [tuple(h) for h in res.meta["flagged"]] == flagged
        for h in top + rest:
            assert res.drops[h] == pytest.approx(grid.drops[h], abs=1e-12)
        assert np.isnan(res.drops).sum() == grid.drops.size - len(top + rest)
        np.testing.assert_allclose(res.meta["attribution"], est["estimate"], rtol=1e-6)


def test_hvp_options_are_refused_at_the_door():
    model = random_model("rope")
    tokens, labels, pad = inputs(4)
    with pytest.raises(ValueError, match="steps must be at most 6"):
        rank_heads(model, tokens, labels, pad, steps=7, path="hvp")
    with pytest.raises(ValueError, match="verify_flagged is for path 'hvp'"):
        Attribution(verify_flagged=2)
    with pytest.raises(ValueError, match="verify_flagged must be None or an integer"):
        Attribution(path="hvp", verify_flagged=-1)

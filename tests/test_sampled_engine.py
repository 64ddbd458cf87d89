"""``ablate_heads(engine="sampled")``: the exact grid on a seeded share of the examples, the heads
it ranks first verified on all of them, held against the naive loop on the same examples."""

from __future__ import annotations

import numpy as np
import pytest
from circuit_env import inputs, random_model

from probes import ablate_heads, find_deposits
from probes.ablation import AblationResult, Sampled, ablate_heads_naive
from probes.common.metrics import harm


@pytest.fixture(scope="module")
def setup():
    return random_model("rope", n_heads=4), *inputs(60, seed=3)


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_sampling_every_example_is_the_exact_grid(setup, method):
    model, tokens, labels, pad = setup
    exact = ablate_heads(model, tokens, labels, pad_mask=pad, method=method, n_bootstrap=40)
    full = ablate_heads(
        model,
        tokens,
        labels,
        pad_mask=pad,
        method=method,
        n_bootstrap=40,
        engine=Sampled(share=1.0),
    )
    np.testing.assert_allclose(full.drops, exact.drops, atol=1e-12)
    np.testing.assert_allclose(full.values, exact.values, atol=1e-12)
    np.testing.assert_allclose(full.ci_low, exact.ci_low, atol=1e-12)
    assert full.meta["n_sample"] == 60 and full.meta["engine"] == "sampled"


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_unverified_heads_are_the_naive_grid_on_the_sample_and_verified_ones_exact(setup, method):
    model, tokens, labels, pad = setup
    res = ablate_heads(
        model,
        tokens,
        labels,
        pad_mask=pad,
        method=method,
        engine=Sampled(share=0.5, verify_top=2),
        n_bootstrap=30,
        seed=7,
        per_example=True,
    )
    idx = np.array(res.meta["sample_indices"])
    assert len(idx) == res.meta["n_sample"] == 30 and len(set(idx.tolist())) == 30
    ref = (
        {} if method == "zero" else {"reference": (tokens, pad)}
    )  # means over every example, not the sample
    sub = ablate_heads_naive(
        model,
        tokens[idx],
        labels[idx],
        pad_mask=pad[idx],
        method=method,
        n_bootstrap=30,
        seed=7,
        **ref,
    )
    full = ablate_heads_naive(
        model, tokens, labels, pad_mask=pad, method=method, n_bootstrap=30, seed=7
    )
    every = [(layer, h) for layer in range(3) for h in range(4)]
    order = sorted(every, key=lambda lh: -sub.drops[lh])
    verified = [tuple(h) for h in res.meta["verified"]]
    assert verified == order[:2]
    for lh in every:
        want = full if lh in verified else sub
        assert res.drops[lh] == pytest.approx(want.drops[lh], abs=1e-9)
        assert res.ci_high[lh] == pytest.approx(want.ci_high[lh], abs=1e-9)
    assert res.baseline == pytest.approx(full.baseline) and res.n_examples == 60
    np.testing.assert_allclose(harm(res.baseline, res.values, True), res.drops, atol=1e-12)
    v = res.meta["verification"]
    assert v["estimate"] == [pytest.approx(sub.drops[h]) for h in verified]
    assert v["exact"] == [pytest.approx(full.drops[h]) for h in verified]
    # per example: the sampled heads at the sampled examples only, the verified ones everywhere
    rest = np.setdiff1d(np.arange(60), idx)
    unverified = next(lh for lh in every if lh not in verified)
    assert (
        np.isnan(res.per_example[unverified][rest]).all()
        and not np.isnan(res.per_example[unverified][idx]).any()
    )
    assert not np.isnan(res.per_example[verified[0]]).any()


def test_sample_is_a_function_of_the_seed_and_the_result_round_trips(setup, tmp_path):
    model, tokens, labels, pad = setup
    a = ablate_heads(
        model, tokens, labels, pad_mask=pad, engine=Sampled(share=0.3), seed=1, n_bootstrap=0
    )
    b = ablate_heads(
        model, tokens, labels, pad_mask=pad, engine=Sampled(share=0.3), seed=1, n_bootstrap=0
    )
    c = ablate_heads(
        model, tokens, labels, pad_mask=pad, engine=Sampled(share=0.3), seed=2, n_bootstrap=0
    )
    assert a.meta["sample_indices"] == b.meta["sample_indices"] != c.meta["sample_indices"]
    np.testing.assert_array_equal(a.drops, b.drops)
    back = AblationResult.load(a.save(tmp_path / "a.json"))
    np.testing.assert_array_equal(back.drops, a.drops)
    assert back.meta["engine"] == "sampled" and back.meta["verified"] == a.meta["verified"]
    assert not np.isnan(a.drops).any()  # a whole grid: a deposit verdict can be read from it
    assert len(find_deposits(a).layers) == 3


@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.2, True, "half", None])
def test_a_bad_sample_is_one_line(setup, bad):
    model, tokens, labels, pad = setup
    with pytest.raises(ValueError, match="share must be a share") as e:
        Sampled(share=bad)
    assert "\n" not in str(e.value)


def test_sampled_engine_refuses_head_sets_and_a_bad_verify_top(setup):
    model, tokens, labels, pad = setup
    with pytest.raises(ValueError, match="single heads"):
        ablate_heads(model, tokens, labels, pad_mask=pad, engine="sampled", head_sets=[[(0, 1)]])
    with pytest.raises(ValueError, match="verify_top"):
        Sampled(verify_top=0)

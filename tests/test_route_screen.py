"""Route shares screened by attribution (``route_shares(screen=k)``, probes.routes.screen).

References: the exhaustive route shares (themselves checked against naive loops in test_routes
and test_bridge_grouped) for the heads the screen measures; finite differences of the mean logit
difference in each head's output scale for the estimates; a planted single route for the screen's
choice and verdict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bridge_env import sharp_bridge
from test_routes import TASK, model

from probes import positional_dominance, route_shares
from probes.common.inputs import position_permutation
from probes.routes.moving import MovedOutputs, position_routes
from probes.routes.result import RouteShares
from probes.routes.screen import MovedOnce, Screen, route_estimates


def _model(encoding: str, scale: float = 8.0):
    return model(encoding, scale=scale)


def _shares(m, p, **kw) -> RouteShares:
    return route_shares(
        m,
        p.clean.tokens,
        p.corrupt.tokens,
        p.clean.labels,
        p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
        **kw,
    )


@pytest.mark.parametrize("batch_size", [None, 5])
def test_the_measured_heads_equal_the_exhaustive_shares(batch_size):
    """The k heads a screen measures have the exhaustive run's shares and intervals (the moved
    outputs computed once and sliced per chunk, chunks of 5 rows cut to their own width); the
    others are NaN, every route head has an estimate, and the effect is the same."""
    m, p = _model("rope"), TASK.counterfactuals(24, kind="position", seed=3)
    full = _shares(m, p, n_bootstrap=100, batch_size=batch_size)
    got = _shares(m, p, n_bootstrap=100, batch_size=batch_size, screen=3)
    assert got.screened and not full.screened and got.measured.sum() == 3
    assert got.effect == pytest.approx(full.effect, rel=1e-6)
    k = got.measured
    for a, b in ((got.shares, full.shares), (got.ci_low, full.ci_low), (got.ci_high, full.ci_high)):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5)  # fp32 batching
        assert np.isnan(a[full.routes & ~k]).all()
    assert np.isfinite(got.estimates[full.routes]).all()
    # the measured heads are the three largest |estimates|
    est = np.abs(got.estimates[full.routes])
    assert np.sort(np.abs(got.estimates[k])).min() >= np.sort(est)[-3] - 1e-12
    again = RouteShares.from_dict(got.to_dict())
    np.testing.assert_array_equal(again.estimates, got.estimates)
    np.testing.assert_array_equal(again.measured, got.measured)
    assert [u[0] for u in again.units()] == [u[0] for u in got.units()]
    assert len(got.units()) == 3


@pytest.mark.parametrize("path,a0", [("clean", 1.0), ("joint", 0.5)])
def test_the_estimates_are_the_derivative_in_each_heads_scale(path, a0):
    """A head's estimate is the derivative of the mean logit difference in that head's scale on
    the path z' + a (z - z') with every route head at a = 1 ("clean", AtP) or at the one node
    a = 1/2 ("joint"), by finite
    differences here (float64), with z' the moved outputs; the estimate is positive where moving a head's
    positions lowers the logit difference."""
    m, p = _model("rope").double(), TASK.counterfactuals(12, kind="position", seed=5)
    clean, mask = p.clean.tokens, p.clean.pad_mask
    good, bad = p.clean.labels, p.corrupt.labels
    sigma = position_permutation(clean, p.corrupt.tokens)
    _, routes = position_routes(m)
    moved = MovedOnce(MovedOutputs(m, clean, mask, sigma, routes), 7)
    est = route_estimates(m, clean, mask, good, bad, moved, path=path, steps=1, batch_size=7)
    L, H = routes.shape
    z1 = moved.for_chunk(torch.arange(len(clean)), clean.shape[1])

    def mean_ld(layer: int, head: int, eps: float) -> float:
        def hook(z, hook):
            at = int(hook.name.split(".")[1])
            scale = torch.full((H,), a0, dtype=torch.float64)
            if at == layer:
                scale[head] += eps
            zd, od = z.double(), z1[hook.name].double()
            return (od + scale[None, None, :, None] * (zd - od)).to(z.dtype)

        with torch.no_grad():
            logits = m.run_with_hooks(
                clean, mask, fwd_hooks=[(f"blocks.{i}.attn.hook_z", hook) for i in range(L)]
            )
        return float((logits.gather(1, good[:, None]) - logits.gather(1, bad[:, None])).mean())

    for layer in range(L):
        for head in range(H):
            d = (mean_ld(layer, head, 1e-5) - mean_ld(layer, head, -1e-5)) / 2e-5
            assert est[layer, head] == pytest.approx(d, rel=1e-5, abs=1e-7), (layer, head)


def test_a_screen_of_one_finds_a_planted_route_and_decides_on_it():
    """One rotated head among eight: the screen's one exact head is that head, with share 1; the
    others' estimates are exactly 0 (their moved output is their output), so the verdict is yes
    and says what was screened."""
    m = _model("rope(heads=(2,), layers=(1,))", scale=30.0)
    p = TASK.counterfactuals(64, kind="position", seed=3)
    # the planting's route is the only route: a screen needs several, so make every head one
    r = _shares(m, p, n_bootstrap=200, screen=1)
    assert not r.screened  # one route: nothing to screen, measured exhaustively
    m2 = _model("rope(heads=(1, 2), layers=(1,))", scale=30.0)
    with torch.no_grad():  # head 1 of layer 1 rotated but writing nothing: no positional work
        m2.blocks[1].attn.W_O[1].zero_()
    r2 = _shares(m2, p, n_bootstrap=200, screen=1)
    assert r2.screened and r2.measured.sum() == 1 and bool(r2.measured[1, 2])
    assert r2.shares[1, 2] == pytest.approx(1.0, abs=1e-5) and r2.estimates[1, 1] == 0.0
    v = positional_dominance(r2)
    assert v.verdict == "yes" and v.top == "L1H2"
    assert "screened: 1 of 2 routes measured exactly" in v.why and "±0.0%" in v.why


def test_an_unmeasured_estimate_outside_five_percent_keeps_a_yes_undecided():
    base = dict(
        routes=np.ones((1, 2), bool),
        embed=None,
        embed_ci=None,
        effect=2.0,
        effect_ci=(1.9, 2.1),
        counterfactual_effect=2.0,
        identity_gap=0.0,
        n_examples=4000,
        n_bootstrap=1000,
        ci=0.95,
        seed=0,
    )
    shares = np.array([[0.9, np.nan]])
    r = RouteShares(shares, shares - 0.01, shares + 0.01, **base, estimates=np.array([[0.8, 0.2]]))
    v = positional_dominance(r)
    assert v.verdict == "undecided" and "estimated share outside ±5%" in v.why
    quiet = RouteShares(
        shares, shares - 0.01, shares + 0.01, **base, estimates=np.array([[0.8, 0.01]])
    )
    assert positional_dominance(quiet).verdict == "yes"


def test_screened_route_shares_on_a_grouped_bridge_equal_the_exhaustive(tmp_path):
    """Grouped key/value heads (8 query heads on 2 key heads): the measured heads' shares equal
    the exhaustive run's, which test_bridge_grouped checks against a naive loop."""
    shape = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_mlp": 40, "n_ctx": 16}
    shape |= {"d_vocab": 30, "pad_id": 0, "n_kv_heads": 2}
    _, model, _ = sharp_bridge("llama", shape, 3, 12.0, tmp_path / "m", [26, 27, 28, 29])
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 26, (16, 9), generator=g)
    order = torch.stack([torch.randperm(9, generator=g) for _ in range(16)])
    good = torch.randint(0, 4, (16,), generator=g)
    args = (model, clean, clean.gather(1, order), good, (good + 1) % 4)
    full = route_shares(*args, n_bootstrap=0)
    got = route_shares(*args, n_bootstrap=0, screen=3)
    k = got.measured
    assert k.sum() == 3 and np.isnan(got.shares[~k]).all()
    np.testing.assert_allclose(got.shares[k], full.shares[k], rtol=0, atol=1e-6)


def test_a_bad_screen_is_one_line():
    m, p = _model("rope"), TASK.counterfactuals(8, kind="position", seed=3)
    with pytest.raises(ValueError, match="route_shares: Screen: k must be a positive integer"):
        _shares(m, p, screen=0)
    with pytest.raises(ValueError, match="Screen: steps must be a positive integer, got 0"):
        Screen(2, path="joint", steps=0)
    with pytest.raises(ValueError, match="Screen: path must be 'clean' \\(steps 1\\) or 'joint'"):
        Screen(2, path="clean", steps=2)
    with pytest.raises(ValueError, match="route_shares: Screen: k must be a positive integer"):
        _shares(m, p, screen=True)


def test_a_screen_says_no_where_a_planted_route_is_split_in_two(tmp_path):
    """The planted single route (checkpoints/planted-single-yes, every other head silent) with every
    head rotated, and its head copied into a second head, each writing half: two routes of about
    half the effect each. A screen of two measures exactly those two (every silent head's
    estimate is 0), with the exhaustive shares, and both verdicts are no (the runner-up lies
    outside ±5%); the same model unsplit is yes, screened or not."""
    import json
    import shutil
    from pathlib import Path

    from pe_interp.runs.checkpoint import load_run

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "checkpoints" / "planted-single-yes", run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["model"]["encoding"] = [{"name": "rope"}]
    (run_dir / "config.json").write_text(json.dumps(cfg))
    run = load_run(run_dir)
    p = run.task.counterfactuals(64, kind="position", seed=11)
    assert positional_dominance(_shares(run.model, p, n_bootstrap=200, screen=2)).verdict == "yes"
    attn = run.model.blocks[0].attn
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            getattr(attn, name)[2] = getattr(attn, name)[3]
        attn.W_O[2:4] *= 0.5
    full = _shares(run.model, p, n_bootstrap=200)
    r = _shares(run.model, p, n_bootstrap=200, screen=2)
    assert r.screened and {(0, 2), (0, 3)} == {
        tuple(int(i) for i in h) for h in np.argwhere(r.measured)
    }
    assert r.unmeasured_max() == 0.0
    np.testing.assert_allclose(r.shares[r.measured], full.shares[r.measured], atol=1e-5)
    v, w = positional_dominance(r), positional_dominance(full)
    assert v.verdict == w.verdict == "no" and "share lies outside ±5%" in v.why, v.text()

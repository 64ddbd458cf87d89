"""Learned circuits: the soft mask against the boolean one and against finite differences, and
learn_ranking's circuit against an exact measurement of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import FN, SPANS, random_model, random_pairs

from probes.circuits import faithfulness_curve, minimal_circuit
from probes.circuits.engine import capture, contributions, writer_hooks
from probes.circuits.faithfulness import EdgeEvaluator, ablated_metric
from probes.circuits.learned import _budget_mask, _threshold, learn_ranking
from probes.circuits.paths import prune


def _setup(positional: bool):
    model = random_model("rope", n_layers=2)
    clean, corrupt = random_pairs()
    S = 4 if positional else 1
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        ablation="corrupt",
        metric=FN,
        reference=None,
        seed=0,
        batch_size=64,
        spans=SPANS if positional else None,
        n_spans=S,
    )
    with torch.no_grad():
        repl = contributions(model, ev.graph, capture(model, ev.k, writer_hooks(ev.graph))[0])
    return model, ev, repl, S


def _metric(model, ev, repl, keep):
    return ablated_metric(model, ev.graph, ev.c, repl, keep, ev.fn, ev.good, ev.bad, ev.ids)


@pytest.mark.parametrize("positional", [False, True])
def test_a_soft_mask_of_zeros_and_ones_is_the_boolean_mask(positional):
    model, ev, repl, S = _setup(positional)
    rng = np.random.default_rng(0)
    keep = rng.random((3, *ev.graph.valid.shape, S)) < 0.5
    hard = _metric(model, ev, repl, torch.as_tensor(keep))
    soft = _metric(model, ev, repl, torch.as_tensor(keep, dtype=torch.float64))
    torch.testing.assert_close(soft, hard, rtol=1e-12, atol=1e-12)
    assert not np.allclose(hard[0].numpy(), hard[1].numpy())  # the masks matter


@pytest.mark.parametrize("positional", [False, True])
def test_the_soft_masks_gradient_equals_finite_differences(positional):
    """The gradient through the hooks (live terms of ablated upstream writers included) against
    central differences of the float64 model, at an interior soft mask."""
    model, ev, repl, S = _setup(positional)
    rng = np.random.default_rng(1)
    m0 = torch.as_tensor(rng.uniform(0.2, 0.8, (*ev.graph.valid.shape, S)))
    m = m0.clone().requires_grad_(True)
    _metric(model, ev, repl, m[None]).sum().backward()
    assert m.grad is not None
    units = np.argwhere(np.broadcast_to(ev.graph.valid[..., None], m0.shape))
    grads = []
    for u in units[rng.choice(len(units), 12, replace=False)]:
        u = tuple(u)
        d = torch.zeros_like(m0)
        d[u] = 1e-5
        with torch.no_grad():
            fd = (
                _metric(model, ev, repl, (m0 + d)[None]).sum()
                - _metric(model, ev, repl, (m0 - d)[None]).sum()
            ) / 2e-5
        assert float(m.grad[u]) == pytest.approx(float(fd), rel=1e-5, abs=1e-7), u
        grads.append(float(fd))
    assert max(map(abs, grads)) > 1e-3  # the units tested do move the metric


@pytest.mark.parametrize("positional", [False, True])
def test_learned_ranking_ends_on_a_circuit_its_exact_measurement_confirms(positional):
    model = random_model("rope", n_layers=2)
    clean, corrupt = random_pairs()
    spans = dict(spans=SPANS, span_names=list("abcd")) if positional else {}
    r = learn_ranking(model, clean, corrupt, metric=FN, sparsity=0.3, steps=120, lr=0.1, **spans)
    L = r.meta["learned"]
    again = learn_ranking(
        model, clean, corrupt, metric=FN, sparsity=0.3, steps=120, lr=0.1, **spans
    )
    np.testing.assert_array_equal(r.order, again.order)  # deterministic
    assert all(
        p.requires_grad and p.grad is None for p in model.parameters()
    )  # the model untouched
    units = ~np.isnan(r.rank)
    assert sorted(r.order) == sorted(np.flatnonzero(units.ravel())) and r.total == int(units.sum())
    theta = r.scores["learned"]
    assert (
        L["size"] == int((theta[units] > 0).sum()) and 0 < L["size"] < r.total
    )  # sparser than the graph
    assert np.all(np.diff(r.value) <= 0)
    # the masks ended near 0/1: the boolean circuit theta > 0 recovers what the soft one did
    keep = np.nan_to_num(theta, nan=-1.0) > 0
    exact = faithfulness_curve(
        model, r.circuit_of(keep), clean, corrupt, metric=FN, spans=spans.get("spans")
    )
    assert exact["recovered"][0] == pytest.approx(L["recovered_hard"], rel=1e-9)
    assert (
        L["recovered_hard"] == pytest.approx(L["recovered"], abs=0.02) and L["recovered_hard"] > 0.9
    )
    assert L["history"]["density"][-1] < L["history"]["density"][0]
    # by widest path over the logits, the prefix of that size is the connected part of theta > 0
    n = int(prune(r.graph, keep).sum())
    assert np.array_equal(r.keep(r.prefix_for(n)), prune(r.graph, keep))
    c = minimal_circuit(model, r, clean, corrupt, target=0.9, metric=FN, spans=spans.get("spans"))
    assert c.faithfulness["kept"] >= 0.9 and c.faithfulness["total_edges"] == r.total


def test_learn_ranking_rejects_bad_settings():
    model = random_model("rope", n_layers=2)
    clean, corrupt = random_pairs()
    for kw, msg in (
        ({"sparsity": -1.0}, "sparsity"),
        ({"steps": 0}, "steps"),
        ({"beta": 0.5}, "beta"),
        ({"select": "best"}, "select"),
        ({"spans": SPANS}, "span_names"),
        ({"budget": 0}, "budget"),
        ({"budget": 1.0}, "budget"),
        ({"budget": "10%"}, "budget"),
        ({"budget": 0.1, "anneal": 1.5}, "anneal"),
    ):
        with pytest.raises(ValueError, match=msg):
            learn_ranking(model, clean, corrupt, metric=FN, **kw)
    with pytest.raises(ValueError, match="nothing to recover"):
        learn_ranking(model, clean, clean, metric=FN)


def test_a_ranking_reordered_is_the_ranking_of_that_selection():
    from probes.circuits import attribute, rank_edges

    model = random_model("rope", n_layers=2)
    clean, corrupt = random_pairs()
    a = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", spans=SPANS, span_names=list("abcd")
    )
    for positional in (False, True):
        base = rank_edges(a, select="paths", positional=positional)
        for select in ("greedy", "top", "paths"):
            want = rank_edges(a, select=select, positional=positional)
            got = base.reordered(select)
            np.testing.assert_array_equal(got.order, want.order)
            np.testing.assert_array_equal(got.value, want.value)
            assert got.select == select
    with pytest.raises(ValueError, match="select must be one of"):
        base.reordered("best")


def test_the_budget_mask_holds_its_mean_and_its_gradient_is_the_projected_one():
    """``tau`` solves mean(sigmoid(x - tau)) = density; the gradient through it (implicit) equals
    central differences of a loss of the mask with ``tau`` solved again at every point."""
    rng = np.random.default_rng(3)
    x0 = torch.as_tensor(rng.normal(0, 2, 40))
    for density in (0.1, 0.5, 0.93):
        tau = _threshold(x0, density)
        assert float(torch.sigmoid(x0 - tau).mean()) == pytest.approx(density, abs=1e-12)
    c = torch.as_tensor(rng.normal(0, 1, 40))

    def loss(x):
        return (_budget_mask(x, 0.3)[0] * c).sum() ** 2

    x = x0.clone().requires_grad_(True)
    m, t0 = _budget_mask(x, 0.3)
    assert float(m.detach().mean()) == pytest.approx(0.3, abs=1e-12) and float(t0) == pytest.approx(
        float(_threshold(x0, 0.3))
    )
    loss(x).backward()
    assert x.grad is not None and float(x.grad.abs().max()) > 1e-3
    for u in range(0, 40, 7):
        d = torch.zeros_like(x0)
        d[u] = 1e-6
        fd = (loss(x0 + d) - loss(x0 - d)) / 2e-6
        assert float(x.grad[u]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8), u
    # the projection: moving every x alike moves tau alike and leaves the mask, so no gradient along it
    assert float(x.grad.sum()) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("positional", [False, True])
def test_a_budget_ends_on_that_many_units_ranked_along_the_path(positional):
    model = random_model("rope", n_layers=2)
    clean, corrupt = random_pairs()
    spans = dict(spans=SPANS, span_names=list("abcd")) if positional else {}
    r = learn_ranking(model, clean, corrupt, metric=FN, budget=0.2, steps=40, select="top", **spans)
    L = r.meta["learned"]
    units = ~np.isnan(r.rank)
    theta, dropped = r.scores["learned"][units], r.scores["dropped"][units]
    assert L["size"] == round(0.2 * r.total) == int((theta > 0).sum())
    assert (
        np.all((dropped == -1) == (theta > 0))
        and dropped.max() < 40
        and dropped[theta <= 0].min() >= 0
    )
    assert L["history"]["allowed"][19] == pytest.approx(0.2) and L["history"]["density"][
        -1
    ] == pytest.approx(0.2)
    keep = np.nan_to_num(r.scores["learned"], nan=-1.0) > 0
    exact = faithfulness_curve(
        model, r.circuit_of(keep), clean, corrupt, metric=FN, spans=spans.get("spans")
    )
    assert exact["recovered"][0] == pytest.approx(L["recovered_hard"], rel=1e-9)
    # by "top": the kept units by logit, then the dropped ones, the last dropped first
    flat_theta, flat_drop = (
        r.scores["learned"].ravel()[r.order],
        r.scores["dropped"].ravel()[r.order],
    )
    n = L["size"]
    assert np.all(flat_drop[:n] == -1) and np.all(np.diff(flat_theta[:n]) <= 0)
    assert np.all(np.diff(flat_drop[n:]) <= 0)

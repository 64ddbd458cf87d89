"""``attribute(granularity="edge", method="hvp")``: the second-order term of every edge against
``torch.autograd.functional.hvp`` on the reader inputs, against a double central difference of
the exact edge ablation (:func:`ablated_metric`, the edge's move scaled), exact where the metric is
quadratic along the edge, and Hutchinson's estimate converging to the exact diagonal over seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import FN, SPANS, cache_of, forks, random_model, random_pairs
from test_post_norm_edges import _counterfactuals, _single_edges, built  # noqa: F401
from torch.nn.attention import SDPBackend, sdpa_kernel

from pe_interp.tasks.batch import Batch
from probes import attribute
from probes.circuits.attribution_hvp import edge_probes
from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.engine import as_pair, as_run, capture, contributions, writer_hooks
from probes.circuits.evaluator import EdgeEvaluator
from probes.circuits.graph import build_graph, parse
from probes.circuits.runs import resolve


def writer_terms(model, tokens) -> torch.Tensor:
    """Every writer's residual term ``[b, pos, writers, d]`` in graph order, from a cache."""
    cache = cache_of(model, tokens)
    out = [cache["hook_embed"][:, :, None]]
    for layer in range(model.cfg.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        out.append(torch.einsum("bphd,hdm->bphm", z, model.blocks[layer].attn.W_O))
        if model.cfg.d_mlp:
            out.append(cache[f"blocks.{layer}.hook_mlp_out"][:, :, None])
    return torch.cat(out, 2)


def reader_slots(graph) -> list[tuple[str, int | None]]:
    """Each reader's hook and its head slot there (None: the hook is the reader's alone)."""
    out = []
    for r in graph.readers:
        s = parse(r)
        if s.kind == "input":
            out.append((f"blocks.{s.layer}.attn.hook_{s.component}_input", s.head))
        elif s.kind == "mlp":
            out.append((f"blocks.{s.layer}.hook_mlp_in", None))
        else:
            out.append((f"blocks.{graph.n_layers - 1}.hook_resid_post", None))
    return out


def test_hv_is_torch_hvp_on_the_reader_inputs():
    """Denoising (base: the corrupt run): with 3 probes (about 33 edges each) every edge's mean
    ``q`` is ``sum_probes v_e D_e . (H delta)_r`` with ``H delta`` from
    ``torch.autograd.functional.hvp`` of the metric in additive perturbations at the reader hooks
    and ``delta_r = sum_s v_(s,r) D_(s,r)``; the first-order part is AtP's score."""
    model = random_model("rope")
    clean, corrupt = random_pairs()
    graph = build_graph(model.cfg)
    est = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", method="hvp", steps=3, seed=7
    )
    atp = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    np.testing.assert_allclose(est.meta["first_order"], atp.scores, rtol=1e-12, atol=1e-14)
    D = writer_terms(model, clean) - writer_terms(model, corrupt)  # [b, p, W, d]
    slots = reader_slots(graph)
    hooks = list(dict.fromkeys(h for h, _ in slots))
    with forks(model):
        shapes = {h: t.shape for h, t in cache_of(model, corrupt, lambda n: n in hooks).items()}

        def f(*deltas):
            add = lambda x, hook, d: x + d  # noqa: E731
            fwd = [(h, lambda x, hook, d=d: add(x, hook, d)) for h, d in zip(hooks, deltas)]
            return FN(model.run_with_hooks(corrupt, fwd_hooks=fwd), None, None).sum()

        signs, probe = edge_probes(len(clean), graph, 1, 3, 7)
        q = torch.zeros(len(clean), *graph.valid.shape, dtype=torch.float64)
        for p in range(3):
            v = signs[..., 0] * (probe[..., 0] == p)  # [b, R, W]
            delta = {h: torch.zeros(shapes[h], dtype=torch.float64) for h in hooks}
            for r, (h, slot) in enumerate(slots):
                move = torch.einsum("bpwd,bw->bpd", D, v[:, r])
                if slot is None:
                    delta[h] += move
                else:
                    delta[h][:, :, slot] += move
            zeros = tuple(torch.zeros(shapes[h], dtype=torch.float64) for h in hooks)
            with sdpa_kernel(SDPBackend.MATH):
                _, hv = torch.autograd.functional.hvp(f, zeros, tuple(delta[h] for h in hooks))
            hv = dict(zip(hooks, hv))
            for r, (h, slot) in enumerate(slots):
                at = hv[h] if slot is None else hv[h][:, :, slot]
                q[:, r] += v[:, r] * torch.einsum("bpwd,bpd->bw", D, at)
    want = np.where(graph.valid, q.detach().mean(0).numpy(), np.nan)
    assert np.nanmax(np.abs(want)) > 1e-1  # a curvature to get right
    np.testing.assert_allclose(2 * est.meta["second_order"], want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.scores, atp.scores + want / 2, rtol=1e-9, atol=1e-12)


def soft_ablation_curvature(model, graph, batch, eps: float, n_bins: int, spans=None):
    """Per edge (and span) the mean over examples of ``d2m/da2`` at 0, ``m(a)`` the zero-ablation
    metric with the edge's move scaled by ``a`` (a soft keep mask ``1 - a``): a double central
    difference of :func:`ablated_metric` (error ~ eps^2, float64)."""
    run = as_run(model, batch)
    _, fn = resolve("logprob")
    repl = torch.zeros(
        1, run.tokens.shape[1], len(graph.writers), model.cfg.d_model, dtype=torch.float64
    )
    units = np.argwhere(np.broadcast_to(graph.valid[..., None], (*graph.valid.shape, n_bins)))
    keep = torch.ones(2 * len(units) + 1, *graph.valid.shape, n_bins, dtype=torch.float64)
    for i, (r, w, k) in enumerate(units):
        keep[2 * i, r, w, k], keep[2 * i + 1, r, w, k] = 1 - eps, 1 + eps
    with torch.no_grad():
        m = ablated_metric(model, graph, run, repl, keep, fn, run.labels, run.labels, spans)
    m = m.mean(1).numpy()
    out = np.full((*graph.valid.shape, n_bins), np.nan)
    for i, (r, w, k) in enumerate(units):
        out[r, w, k] = (m[2 * i] - 2 * m[-1] + m[2 * i + 1]) / eps**2
    return out


@pytest.mark.parametrize("spans", [False, True])
def test_one_edge_per_probe_is_the_exact_ablations_second_derivative(spans):
    """Zero ablation (base: the clean run; the score is minus the move's effect), ``steps`` = every
    edge (x span): each probe holds one unit, so ``q`` is the exact second derivative of the edge
    ablation in the edge's scale, whole edges and per span (``by_span``'s second-order part
    against AtP's ``by_span``)."""
    model = random_model("rope")
    clean, _ = random_pairs()
    labels = torch.tensor([0, 3, 1])
    batch = Batch(clean, labels, clean != 0)
    graph = build_graph(model.cfg)
    kw = dict(metric="logprob", granularity="edge", ablation="zero", spans=SPANS if spans else None)
    K = 4 if spans else 1
    est = attribute(model, batch, method="hvp", steps=graph.n_edges * K, **kw)
    atp = attribute(model, batch, **kw)
    want = soft_ablation_curvature(model, graph, batch, 1e-4, K, SPANS if spans else None)
    if spans:
        got = -2 * (est.by_span - atp.by_span)
        np.testing.assert_allclose(
            -2 * est.meta["second_order"],
            np.nansum(got, -1) * np.where(graph.valid, 1, np.nan),
            rtol=1e-9,
        )
    else:
        got = -2 * est.meta["second_order"][..., None]
    assert np.nanmax(np.abs(want)) > 1e-1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("ablation", ["corrupt", "mean"])
def test_on_a_quadratic_metric_the_second_order_estimate_is_the_exact_edge_effect(ablation):
    """One attention-only layer, no norms: the pooled logits are affine in a value input and
    in the readout's input, so a metric quadratic in the logits is quadratic along every edge into
    a ``.v`` reader or the readout, and the second-order score (one edge a probe) is the exact
    single-edge ablation's effect (:class:`EdgeEvaluator`); AtP alone is not. Query and key edges
    go through the softmax and are left out."""
    model = random_model(
        "rope", n_layers=1, n_heads=4, d_mlp=0, final_norm=False, normalization_type=None
    )
    clean, corrupt = random_pairs(seed=2)

    def quad(logits, good, bad):
        return -((logits - 0.3) ** 2).sum(-1) + 2 * logits[:, 1]

    pair = dict(corrupt=corrupt) if ablation == "corrupt" else dict(ablation="mean")
    kw = dict(
        metric=quad, granularity="edge", **({"direction": "noise"} if ablation == "corrupt" else {})
    )
    graph = build_graph(model.cfg)
    est = attribute(model, clean, method="hvp", steps=graph.n_edges, **pair, **kw)
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        ablation=ablation,
        metric=quad,
        reference=None,
        seed=0,
        batch_size=None,
        spans=None,
        n_spans=1,
    )
    linear = [i for i, r in enumerate(graph.readers) if r == "logits" or r.endswith(".v")]
    units = [(r, w) for r in linear for w in np.flatnonzero(graph.valid[r])]
    keeps = np.ones((len(units) + 1, *graph.valid.shape, 1), dtype=bool)
    for i, (r, w) in enumerate(units):
        keeps[i, r, w] = False
    m = ev(keeps).mean(1)
    exact = m[-1] - m[:-1]  # m(clean) - m(edge ablated)
    got = np.array([est.scores[r, w] for r, w in units])
    first = np.array([est.meta["first_order"][r, w] for r, w in units])
    np.testing.assert_allclose(got, exact, rtol=1e-9, atol=1e-12)
    assert np.abs(first - exact).max() > 1e-2  # the correction did something
    rel = np.abs(got - first) / np.abs(first)
    np.testing.assert_allclose([est.meta["reliability"][u] for u in units], rel, rtol=1e-9)
    np.testing.assert_array_equal([est.meta["flagged"][u] for u in units], rel > 1)


def test_hutchinson_over_seeds_converges_to_the_exact_diagonal():
    """With 4 probes (about 25 edges each) the cross terms make each seed's ``q`` noisy but
    unbiased: over 40 seeds (160 probes) the mean is within 4.5 standard errors of the exact
    diagonal (one edge a probe) for all but 2% of the edges, and its error is under 0.3 of a
    single seed's (1/sqrt(40) = 0.16 expected); a biased estimator fails both."""
    model = random_model("rope")
    clean, corrupt = random_pairs()
    graph = build_graph(model.cfg)
    kw = dict(metric=FN, granularity="edge", method="hvp")

    def q(**more):
        return 2 * attribute(model, clean, corrupt, **kw, **more).meta["second_order"][graph.valid]

    exact = q(steps=graph.n_edges)
    draws = np.stack([q(steps=4, seed=s) for s in range(40)])
    err_one = np.sqrt(((draws - exact) ** 2).mean())
    assert err_one > 1e-2 * np.abs(exact).max()  # the cross terms are there to average out
    mean, se = draws.mean(0), draws.std(0, ddof=1) / np.sqrt(len(draws))
    z = np.abs(mean - exact) / np.maximum(se, 1e-12)
    assert (z > 4.5).mean() <= 0.02, np.sort(z)[-5:]
    assert np.sqrt(((mean - exact) ** 2).mean()) < 0.3 * err_one


def test_hvp_options_are_refused_at_the_door():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    n_edges = build_graph(model.cfg).n_edges
    cases = {
        "granularity='edge'": dict(granularity="node"),
        "by_position is not available with method='hvp'": dict(
            granularity="edge", by_position=True
        ),
        f"steps must be at most {n_edges}, got {n_edges + 1}": dict(
            granularity="edge", steps=n_edges + 1
        ),
        "aligned=True is for method='atp'": dict(granularity="edge", aligned=True),
    }
    for match, kw in cases.items():
        with pytest.raises(ValueError, match=match):
            attribute(model, clean, corrupt, metric=FN, method="hvp", **kw)


@pytest.mark.parametrize("kv_view", ["grouped", "ungrouped"])
def test_under_a_norm_after_attention_q_is_the_exact_ablations_curvature(built, kv_view):  # noqa: F811
    """Gemma 2 (tiny, float32; norms after attention and MLP, 2 key/value heads of 4), noising
    with the corrupt run, one edge a probe: ``q`` is the second derivative of the exact edge
    ablation, which recomputes the norm (:func:`ablated_metric` with a soft keep mask,
    ``torch.autograd.functional.hvp`` along each edge: the norm's own curvature included), in
    both views of the key/value heads."""
    _, model = built("gemma2")
    pairs = _counterfactuals()
    graph = build_graph(model.cfg, kv_view)
    kw = dict(granularity="edge", direction="noise", metric="logit_diff", kv_view=kv_view)
    est = attribute(model, pairs, method="hvp", steps=graph.n_edges, **kw)
    assert est.meta["post_norm"] == "jacobian"
    c, k = as_pair(model, pairs, None, "test")
    _, fn = resolve("logit_diff")
    with torch.no_grad():
        repl = contributions(model, graph, capture(model, k, writer_hooks(graph))[0])
    pattern = [(f"blocks.{i}.attn.hook_pattern", lambda x, hook: x) for i in range(graph.n_layers)]

    def f(keep):
        with model.hooks(fwd_hooks=pattern):  # eager attention: SDPA's math kernel
            return ablated_metric(model, graph, c, repl, keep, fn, c.labels, k.labels).mean()

    edges = [(graph.reader_index(r), graph.writer_index(w)) for w, r in _single_edges(graph)]
    want = []
    for r, w in edges:
        v = torch.zeros(1, *graph.valid.shape)
        v[0, r, w] = 1.0
        with sdpa_kernel(SDPBackend.MATH):
            want.append(float(torch.autograd.functional.hvp(f, torch.ones_like(v), v)[1][0, r, w]))
    got = np.array([-2 * est.meta["second_order"][e] for e in edges])
    scale = np.abs(want).max()
    assert scale > 1e-1
    print(f"{kv_view}: max |q - hvp| {np.abs(got - want).max():.1e}, max |q| {scale:.2f}")
    np.testing.assert_allclose(got, want, atol=2e-4 * scale)

"""probes.attribute against TransformerLens' attribution_patch, against autograd loops written
here (EAP-IG's steps one at a time, GradDrop's dropped blocks, AtP*'s softmax recomputed head by
head through TransformerLens' fork hooks), and against the exact effect (path patching, head
ablation) where first order is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import autograd_at, cache_of, class_metric, forks, random_model, random_pairs
from transformer_lens.tools.analysis import attribution_patching as ap

from pe_interp.tasks.batch import Batch
from probes import ablate_heads, attribute, path_patch
from probes.circuits.engine import contributions, writer_hooks
from probes.circuits.graph import build_graph

FN = lambda logits, good, bad: logits[:, 1] - logits[:, 0]  # noqa: E731  (class_metric(1, 0) per row)


def ours_name(node: ap.Node) -> str:
    if node.kind == "embed":
        return "embed"
    if node.kind == "attn_head_out":
        return f"L{node.layer}H{node.head}"
    if node.kind in ("mlp_out", "mlp_in"):
        return f"MLP{node.layer}"
    if node.kind == "logits":
        return "logits"
    return f"L{node.layer}H{node.head}.{node.kind[0]}"


@pytest.mark.parametrize("encoding", ["rope", "t5", "alibi", "sinusoidal"])
def test_node_and_edge_scores_equal_transformer_lens(encoding):
    model = random_model(encoding)
    clean, corrupt = random_pairs()
    metric = class_metric(1, 0)
    tl = ap.attribution_patch(model, clean, corrupt, metric)
    ours = attribute(model, clean, corrupt, metric=FN, by_position=True)
    got = [ours.by_position[ours.writers.index(ours_name(n)), n.position] for n in tl.node_scores]
    np.testing.assert_allclose(got, list(tl.node_scores.values()), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours.scores, ours.by_position.sum(-1), rtol=1e-12)
    tle = ap.attribution_patch(
        model, clean, corrupt, metric, ap.EdgeAttributionConfig(granularity="edge")
    )
    oe = attribute(model, clean, corrupt, metric=FN, granularity="edge", by_position=True)
    got = [
        oe.by_position[oe.readers.index(ours_name(r)), oe.writers.index(ours_name(w)), w.position]
        for w, r in tle.edge_scores
    ]
    np.testing.assert_allclose(got, list(tle.edge_scores.values()), rtol=1e-9, atol=1e-12)
    assert int((~np.isnan(oe.by_position)).sum()) == len(tle.edge_scores)  # the same edges, no more
    # a writer's edges add up to its node score (the readout reads everything)
    np.testing.assert_allclose(np.nansum(oe.scores, 0), ours.scores, rtol=1e-9, atol=1e-12)
    assert np.abs(ours.scores).max() > 1e-2


def test_embed_kv_edges_are_restricted_and_match_autograd():
    model = random_model("sinusoidal", kv_source="embed")
    clean, corrupt = random_pairs()
    oe = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    graph = build_graph(model.cfg)
    for reader in ("L1H0.k", "L2H1.v"):
        row = oe.scores[oe.readers.index(reader)]
        assert not np.isnan(row[0]) and np.isnan(row[1:]).all()  # only the embedding feeds k/v
    with forks(model):
        grads = autograd_at(
            model,
            corrupt,
            class_metric(1, 0),
            ["blocks.2.attn.hook_v_input", "blocks.1.attn.hook_q_input"],
        )
    delta = cache_of(model, clean)["hook_embed"] - cache_of(model, corrupt)["hook_embed"]
    want = float((delta * grads["blocks.2.attn.hook_v_input"][:, :, 1]).sum() / 3)
    assert oe.edge("embed", "L2H1.v") == pytest.approx(want, rel=1e-9, abs=1e-12)
    acts = {k: v for k, v in cache_of(model, clean).items() if k in writer_hooks(graph)}
    cont = contributions(model, graph, acts) - contributions(
        model, graph, {k: cache_of(model, corrupt)[k] for k in acts}
    )
    want = float(
        (
            cont[:, :, graph.writer_index("L0H1")] * grads["blocks.1.attn.hook_q_input"][:, :, 0]
        ).sum()
        / 3
    )
    assert oe.edge("L0H1", "L1H0.q") == pytest.approx(want, rel=1e-9, abs=1e-12)


def linear_model(encoding: str):
    """No norms, no MLPs: each last-layer value input reaches the logits linearly, and so does
    the pattern a query or key input sets."""
    return random_model(encoding, d_mlp=0, normalization_type=None)


@pytest.mark.parametrize("encoding", ["rope", "t5", "sinusoidal"])
def test_estimates_are_exact_where_first_order_is(encoding):
    model = linear_model(encoding)
    clean, corrupt = random_pairs()
    last = [f"L2H{h}" for h in range(2)]
    exact = {c: path_patch(model, clean, corrupt, None, last, c, metric=FN) for c in "qkv"}
    exact["logits"] = path_patch(model, clean, corrupt, None, ["logits"], metric=FN)
    for method in ("atp", "atp*", "eap-ig"):
        est = attribute(
            model, clean, corrupt, metric=FN, granularity="edge", method=method, steps=3
        )
        for site, pp in exact.items():
            e = np.array([[est.edge(s, r) for r in pp.receivers] for s in pp.senders])
            ok = ~np.isnan(pp.values)
            exact_here = (
                (site == "logits") or (site == "v" and method != "eap-ig") or (method == "atp*")
            )
            if exact_here:
                np.testing.assert_allclose(
                    e[ok], pp.effects[ok], rtol=1e-9, atol=1e-12, err_msg=f"{method} {site}"
                )
            elif (
                site in "qk" or method == "eap-ig"
            ):  # the softmax (or the path average) is not linear
                assert np.abs(e[ok] - pp.effects[ok]).max() > 1e-3, (method, site)
    # noising (gradient at the clean run): minus the effect of patching corrupt into clean
    noised = est_noise = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", method="atp*", direction="noise"
    )
    for c in "qk":
        swapped = path_patch(
            model, corrupt, clean, None, last, c, metric=FN
        )  # runs clean, adds corrupt - clean
        e = np.array([[noised.edge(s, r) for r in swapped.receivers] for s in swapped.senders])
        ok = ~np.isnan(swapped.values)
        np.testing.assert_allclose(e[ok], -swapped.effects[ok], rtol=1e-9, atol=1e-12)
    assert est_noise.mode == "noise"


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_ablation_estimate_is_the_exact_drop_of_a_last_layer_head(ablation):
    model = linear_model("rope")
    clean, _ = random_pairs()
    labels = torch.tensor([1, 3, 0])
    batch = Batch(clean, labels, clean != 0)
    est = attribute(model, batch, metric="logit", ablation=ablation, direction="noise")
    exact = ablate_heads(
        model, clean, labels, pad_mask=clean != 0, method=ablation, metric="logit", n_bootstrap=0
    )
    np.testing.assert_allclose(est.head_scores()[2], exact.drops[2], rtol=1e-9, atol=1e-12)
    assert np.abs(est.head_scores()[0] - exact.drops[0]).max() > 1e-4  # earlier heads: not linear


def naive_ig_edges(model, clean, corrupt, steps: int) -> dict[tuple[str, str], float]:
    """EAP-IG step by step: hook_embed set to corrupt + k/steps (clean - corrupt), autograd at the
    reader forks, gradients averaged, dotted with each writer's clean-minus-corrupt term."""
    graph = build_graph(model.cfg)
    e_c, e_k = cache_of(model, clean)["hook_embed"], cache_of(model, corrupt)["hook_embed"]
    readers = {
        "blocks.2.attn.hook_q_input": "q",
        "blocks.1.hook_mlp_in": "mlp",
        "blocks.2.hook_resid_post": "logits",
    }
    total = {n: 0.0 for n in readers}
    for k in range(1, steps + 1):
        x = e_k + k / steps * (e_c - e_k)
        with forks(model):
            zero = {}

            def set_embed(t, hook, x=x):
                return x

            names = list(readers)

            def add_zero(t, hook, zero=zero):
                zero[hook.name] = torch.zeros_like(t, requires_grad=True)
                return t + zero[hook.name]

            with torch.enable_grad():
                logits = model.run_with_hooks(
                    corrupt, fwd_hooks=[("hook_embed", set_embed)] + [(n, add_zero) for n in names]
                )
                g = torch.autograd.grad(
                    (logits[:, 1] - logits[:, 0]).sum(), [zero[n] for n in names]
                )
        for n, gi in zip(names, g):
            total[n] = total[n] + gi / steps
    a_c = {n: cache_of(model, clean)[n] for n in writer_hooks(graph)}
    a_k = {n: cache_of(model, corrupt)[n] for n in writer_hooks(graph)}
    delta = contributions(model, graph, a_c) - contributions(model, graph, a_k)
    out = {}
    for w in ("embed", "L0H1", "L1H0", "MLP0", "MLP1"):
        d = delta[:, :, graph.writer_index(w)]
        if w != "MLP1":
            out[w, "L2H1.q"] = float((d * total["blocks.2.attn.hook_q_input"][:, :, 1]).sum() / 3)
        if w not in ("MLP1",):
            out[w, "MLP1"] = float((d * total["blocks.1.hook_mlp_in"]).sum() / 3)
        out[w, "logits"] = float((d * total["blocks.2.hook_resid_post"]).sum() / 3)
    return out


def test_eap_ig_equals_integrated_gradients_step_by_step():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    for steps, batch_size in (
        (3, 256),
        (5, 4),
    ):  # 4 rows: one step per forward, and part of a chunk
        est = attribute(
            model,
            clean,
            corrupt,
            metric=FN,
            granularity="edge",
            method="eap-ig",
            steps=steps,
            batch_size=batch_size,
        )
        for (w, r), want in naive_ig_edges(model, clean, corrupt, steps).items():
            assert est.edge(w, r) == pytest.approx(want, rel=1e-8, abs=1e-12), (steps, w, r)


def test_eap_ig_is_complete_at_the_input():
    """Integrated gradients sum to the metric's change over the path: the embedding's node score
    is mean(m(clean) - m(corrupt)) up to the Riemann error."""
    model = random_model("t5")
    clean, corrupt = random_pairs()
    est = attribute(model, clean, corrupt, metric=FN, method="eap-ig", steps=64)
    gap = est.clean_metric - est.corrupt_metric
    assert abs(gap) > 0.05
    assert est.node_scores()["embed"] == pytest.approx(gap, rel=0.02)
    plain = attribute(model, clean, corrupt, metric=FN)
    assert abs(plain.node_scores()["embed"] - gap) > 0.05 * abs(gap)  # plain AtP is not complete


def naive_atp_star(model, clean, corrupt) -> tuple[dict, dict]:
    """AtP* edges into the query inputs of layer 2 and their GradDrop magnitude, head by head: the
    pattern with one writer's term added to one head's q fork (TransformerLens' hook), and
    dm/dA with block l's outputs detached (l = 0, 1, 2)."""
    graph = build_graph(model.cfg)
    a_c = {n: cache_of(model, clean)[n] for n in writer_hooks(graph)}
    a_k = {n: cache_of(model, corrupt)[n] for n in writer_hooks(graph)}
    delta = contributions(model, graph, a_c) - contributions(model, graph, a_k)
    name = "blocks.2.attn.hook_pattern"

    def grad_at_pattern(drop: int | None):
        zero = {}

        def hooks():
            def add_zero(t, hook):
                zero["A"] = torch.zeros_like(t, requires_grad=True)
                return t + zero["A"]

            out = [(name, add_zero)]
            if drop is not None:
                out += [
                    (f"blocks.{drop}.{h}", lambda t, hook: t.detach())
                    for h in ("hook_attn_out", "hook_mlp_out")
                ]
            return out

        with torch.enable_grad():
            logits = model.run_with_hooks(corrupt, fwd_hooks=hooks())
            return torch.autograd.grad(
                (logits[:, 1] - logits[:, 0]).sum(), [zero["A"]], allow_unused=True
            )[0]

    base = cache_of(model, corrupt)[name]
    grads = [grad_at_pattern(None)] + [grad_at_pattern(drop) for drop in range(3)]
    grads = [torch.zeros_like(base) if g is None else g for g in grads]
    signed, magnitude = {}, {}
    for w in ("embed", "L0H0", "L1H1", "MLP1"):
        for h in range(2):
            seen = {}

            def add(t, hook, w=w, h=h):
                t = t.clone()
                t[:, :, h] += delta[:, :, graph.writer_index(w)]
                return t

            with forks(model), torch.no_grad():
                model.run_with_hooks(
                    corrupt,
                    fwd_hooks=[
                        ("blocks.2.attn.hook_q_input", add),
                        (name, lambda t, hook, seen=seen: seen.setdefault("A", t)),
                    ],
                )
            dA = (seen["A"] - base)[:, h]
            per = [float((dA * g[:, h]).sum() / 3) for g in grads]
            signed[w, f"L2H{h}.q"] = per[0]
            magnitude[w, f"L2H{h}.q"] = sum(abs(x) for x in per[1:]) / 2
    return signed, magnitude


def test_atp_star_equals_softmax_recomputed_head_by_head_and_graddrop():
    model = random_model("alibi")
    clean, corrupt = random_pairs()
    est = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", method="atp*", batch_size=8
    )
    signed, magnitude = naive_atp_star(model, clean, corrupt)
    for (w, r), want in signed.items():
        assert est.edge(w, r) == pytest.approx(want, rel=1e-8, abs=1e-12), (w, r)
        got = est.magnitude[est.readers.index(r), est.writers.index(w)]
        assert got == pytest.approx(magnitude[w, r], rel=1e-8, abs=1e-12), (w, r)
    plain = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    diff = max(abs(plain.edge(w, r) - v) for (w, r), v in signed.items())
    assert diff > 1e-4  # the recomputed softmax differs from the linearised one here
    nodes = attribute(model, clean, corrupt, metric=FN, method="atp*")
    np.testing.assert_allclose(nodes.scores, np.nansum(est.scores, 0), rtol=1e-9, atol=1e-12)
    # GradDrop of the readout's edges: no dropped block zeroes them, so the mean is over all 3
    g = est.magnitude[est.readers.index("logits")]
    np.testing.assert_allclose(g, np.abs(est.scores[est.readers.index("logits")]), rtol=1e-9)


def test_result_saves_and_loads(tmp_path):
    model = random_model("rope")
    clean, corrupt = random_pairs()
    est = attribute(model, clean, corrupt, metric=FN, granularity="edge", method="atp*")
    back = type(est).load(est.save(tmp_path / "a.json"))
    np.testing.assert_array_equal(back.scores, est.scores)
    np.testing.assert_array_equal(back.magnitude, est.magnitude)
    assert back.top_edges(5) == est.top_edges(5) and back.readers == est.readers


def test_bad_inputs_fail_in_one_line():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    calls = {
        "eap-ig needs corrupt": lambda: attribute(model, Batch(clean, torch.zeros(3, dtype=torch.long), clean != 0), method="eap-ig"),
        "atp* by position": lambda: attribute(model, clean, corrupt, method="atp*", by_position=True),
        "unknown method": lambda: attribute(model, clean, corrupt, method="ig"),
        "shapes": lambda: attribute(model, clean, corrupt[:, :5]),
        "steps": lambda: attribute(model, clean, corrupt, method="eap-ig", steps=0),
        "metric": lambda: attribute(model, clean, corrupt, metric="accuracy"),
    }  # fmt: skip
    for label, call in calls.items():
        with pytest.raises(ValueError) as err:
            call()
        assert "\n" not in str(err.value), label

"""Circuits: selection against a plain sort, the faithfulness curve against TransformerLens'
faithfulness pair by pair (corrupt and mean ablation, whole edges and edges per span), the
counterfactual families, the smallest faithful circuit, the ACDC reference against a naive
loop, and ablate_heads(engine="attribution") against the exact sweep."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import FN, SPANS, class_metric, random_model, random_pairs
from transformer_lens.tools.analysis import attribution_patching as ap

from pe_interp.config.presets import build_run_configs
from probes import (
    Circuit,
    ablate_heads,
    attribute,
    circuit,
    faithfulness_curve,
    family_attributions,
    find_deposits,
)
from probes.ablation import Attribution


def tl_node(name: str, pos: int, n_layers: int, reader: bool) -> ap.Node:
    if name == "embed":
        return ap.Node(kind="embed", position=pos)
    if name == "logits":
        return ap.Node(kind="logits", position=pos, layer=n_layers - 1)
    if name.startswith("MLP"):
        return ap.Node(kind="mlp_in" if reader else "mlp_out", position=pos, layer=int(name[3:]))
    head, _, comp = name.partition(".")
    layer, h = (int(x) for x in head[1:].split("H"))
    return ap.Node(
        kind=f"{comp}_input" if reader else "attn_head_out", position=pos, layer=layer, head=h
    )


def tl_edges(c: Circuit, n_pos: int, n_layers: int) -> list:
    return [
        (tl_node(w, p, n_layers, False), tl_node(r, p, n_layers, True))
        for w, r in c.edges
        for p in range(n_pos)
    ]


def test_circuit_keeps_the_top_edges():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    a = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    ranked = sorted(a.edge_scores().items(), key=lambda kv: -abs(kv[1]))
    c = circuit(a, top_n=7, select="top")
    assert list(c.edges) == [e for e, _ in ranked[:7]]
    np.testing.assert_allclose(c.scores["score"], [s for _, s in ranked[:7]])
    t = circuit(a, threshold=abs(ranked[7][1]), select="top")
    assert list(t.edges) == [e for e, _ in ranked[:8]]
    assert set(c.nodes) == {w for w, _ in c.edges} | {r.split(".")[0] for _, r in c.edges}
    assert c.total_edges == len(ranked)
    with pytest.raises(ValueError):
        circuit(a, top_n=3, threshold=0.1)
    with pytest.raises(ValueError):
        circuit(attribute(model, clean, corrupt, metric=FN), top_n=3)  # node scores


@pytest.mark.parametrize("encoding", ["rope", "t5"])
def test_faithfulness_curve_equals_transformer_lens_pair_by_pair(encoding):
    model = random_model(encoding)
    clean, corrupt = random_pairs()
    a = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    for size in (0, 12, 60):
        c = circuit(a, top_n=size, select="top")
        ours = faithfulness_curve(model, c, clean, corrupt, sizes=[size], metric=FN, batch_size=2)
        for i in range(3):
            tl = ap.faithfulness(
                model, clean[i : i + 1], corrupt[i : i + 1], class_metric(1, 0), tl_edges(c, 8, 3)
            )
            got = (ours["per_example"][0, i] - tl.corrupt_metric) / (
                tl.full_metric - tl.corrupt_metric
            )
            assert got == pytest.approx(tl.recovered, rel=1e-7, abs=1e-9), (size, i)
    assert ours["full"] == pytest.approx(a.clean_metric) and ours["empty"] == pytest.approx(
        a.corrupt_metric
    )


def test_mean_ablation_equals_transformer_lens_with_full_length_calibration():
    model = random_model("alibi")
    clean, corrupt = random_pairs()
    g = torch.Generator().manual_seed(3)
    calib = torch.randint(1, 20, (5, 8), generator=g)  # no pads: a plain mean per position, as TL
    a = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    c = circuit(a, top_n=25, select="top")
    ours = faithfulness_curve(
        model, c, clean, corrupt, sizes=[25], metric=FN, ablation="mean", reference=calib
    )
    for i in range(3):
        tl = ap.faithfulness(
            model,
            clean[i : i + 1],
            corrupt[i : i + 1],
            class_metric(1, 0),
            tl_edges(c, 8, 3),
            ap.FaithfulnessConfig(ablation="mean"),
            mean_tokens=calib,
        )
        got = (ours["per_example"][0, i] - tl.corrupt_metric) / (tl.full_metric - tl.corrupt_metric)
        assert got == pytest.approx(tl.recovered, rel=1e-7, abs=1e-9)


def test_resample_is_corrupt_ablation_with_the_derangement():
    from probes.ablation import resample_sources

    model = random_model("rope")
    clean, corrupt = random_pairs()
    a = attribute(model, clean, corrupt, metric=FN, granularity="edge")
    src = resample_sources(3, None, 4)
    res = faithfulness_curve(
        model, a, clean, None, sizes=[0, 5, 30], ablation="resample", seed=4, metric=FN
    )
    cor = faithfulness_curve(model, a, clean, clean[src], sizes=[0, 5, 30], metric=FN)
    np.testing.assert_allclose(res["metric"], cor["metric"], rtol=1e-12)
    assert res["recovered"][0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_position_aware_faithfulness_equals_transformer_lens_per_position(encoding):
    """An edge kept at a span is TransformerLens' edge at each of that example's positions in the
    span: the same number, example by example."""
    model = random_model(encoding)
    clean, corrupt = random_pairs()
    a = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", spans=SPANS, span_names=list("abcd")
    )
    for size in (9, 40):
        c = circuit(a, top_n=size, positional=True)
        ours = faithfulness_curve(
            model, c, clean, corrupt, sizes=[len(c.edges)], metric=FN, spans=SPANS, batch_size=2
        )
        for i in range(3):
            edges = [
                (tl_node(w, p, 3, False), tl_node(r, p, 3, True))
                for (w, r), s in zip(c.edges, c.spans)
                for p in range(8)
                if SPANS[i, p] == "abcd".index(s)
            ]
            tl = ap.faithfulness(
                model, clean[i : i + 1], corrupt[i : i + 1], class_metric(1, 0), edges
            )
            got = (ours["per_example"][0, i] - tl.corrupt_metric) / (
                tl.full_metric - tl.corrupt_metric
            )
            assert got == pytest.approx(tl.recovered, rel=1e-7, abs=1e-9), (size, i)


def test_smallest_faithful_circuit_and_the_curve():
    from probes.circuits import curve_area, minimal_circuit, rank_edges

    model = random_model("rope")
    clean, corrupt = random_pairs()
    a = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", spans=SPANS, span_names=list("abcd")
    )
    for positional in (False, True):
        r = rank_edges(a, positional=positional)
        c = minimal_circuit(model, r, clean, corrupt, target=0.8, metric=FN, spans=SPANS)
        f = c.faithfulness
        assert f["kept"] >= 0.8 and f["size"] == len(c.edges) and f["total_edges"] == r.total
        again = faithfulness_curve(model, c, clean, corrupt, metric=FN, spans=SPANS)
        assert again["recovered"][0] == pytest.approx(f["kept"], rel=1e-9)
        shorter = f["sizes"].index(
            f["prefix"] - 1
        )  # the prefix one unit shorter was measured: below target
        assert f["recovered"][shorter] < 0.8
        curve = faithfulness_curve(model, r, clean, corrupt, metric=FN, spans=SPANS)
        assert (
            curve["sizes"][0] == 0
            and curve["sizes"][-1] == r.total
            and curve["recovered"][-1] == pytest.approx(1.0)
        )
        assert curve["area"] == pytest.approx(
            curve_area(curve["kept"], curve["recovered"], r.total)
        )
    assert curve_area([0, 1, 2], [0.0, 1.0, 1.0], 2) == pytest.approx(0.75)


def test_smallest_circuit_to_a_tolerance_measures_fewer_circuits():
    """With ``tolerance`` the search stops once the sizes either side of the target are that close
    (relative to the larger): the circuit still reaches the target (its faithfulness measured
    again from scratch), a size at most that far below it was measured below the target, and
    ``forwards`` counts the circuits measured, the clean and corrupt ends included."""
    from probes.circuits import minimal_circuit, rank_edges

    model = random_model("rope")
    clean, corrupt = random_pairs()
    a = attribute(
        model, clean, corrupt, metric=FN, granularity="edge", spans=SPANS, span_names=list("abcd")
    )
    r = rank_edges(a, positional=True)
    exact = minimal_circuit(model, r, clean, corrupt, target=0.8, metric=FN, spans=SPANS)
    kw = dict(target=0.8, metric=FN, spans=SPANS, points=6, per_round=2, tolerance=0.2)
    loose = minimal_circuit(model, r, clean, corrupt, **kw)
    f, e = loose.faithfulness, exact.faithfulness
    assert f["forwards"] == len(f["sizes"]) < e["forwards"] == len(e["sizes"])
    assert f["kept"] >= 0.8 and f["prefix"] >= e["prefix"]
    again = faithfulness_curve(model, loose, clean, corrupt, metric=FN, spans=SPANS)
    assert again["recovered"][0] == pytest.approx(f["kept"], rel=1e-9)
    below = [n for n, rec in zip(f["sizes"], f["recovered"]) if n < f["prefix"] and rec < 0.8]
    assert f["prefix"] - max(below) <= max(1, 0.2 * f["prefix"])
    with pytest.raises(ValueError, match=r"^minimal_circuit: per_round >= 1"):
        minimal_circuit(model, r, clean, corrupt, target=0.8, metric=FN, spans=SPANS, tolerance=1)


@pytest.mark.parametrize("positional", [False, True])
def test_acdc_equals_a_naive_loop_of_exact_forwards(positional, capsys):
    """Speculation and skipping units that no longer reach the logits change no decision (nor
    does the progress bar, which counts every unit decided)."""
    from probes.circuits.acdc import acdc, overlap
    from probes.circuits.faithfulness import EdgeEvaluator
    from probes.circuits.paths import prune

    model = random_model("rope", n_layers=2)
    clean, corrupt = random_pairs()
    spans = (SPANS >= 2).long() if positional else None  # two spans: the first half, the second
    c = acdc(
        model,
        clean,
        corrupt,
        tau=0.02,
        metric=FN,
        spans=spans,
        span_names=["a", "b"] if positional else None,
        speculate=8,
        progress=positional,
    )
    S = 2 if positional else 1
    ev = EdgeEvaluator(
        model,
        clean,
        corrupt,
        ablation="corrupt",
        metric=FN,
        reference=None,
        seed=0,
        batch_size=64,
        spans=spans,
        n_spans=S,
    )
    g = ev.graph
    keep = np.broadcast_to(g.valid[..., None], (*g.valid.shape, S)).copy()
    full, empty = ev.ends()
    current = ev(keep[None]).mean()
    for r in reversed(range(len(g.readers))):
        for w in reversed(range(len(g.writers))):
            for s in range(S):
                if keep[r, w, s]:
                    keep[r, w, s] = False
                    v = ev(keep[None]).mean()
                    if abs(v - current) < 0.02 * abs(full - empty):
                        current = v
                    else:
                        keep[r, w, s] = True
    keep = prune(g, keep)
    assert np.array_equal(c.keep_mask(g), keep) and 0 < len(c.edges) < c.total_edges
    assert c.faithfulness["kept"] == pytest.approx((ev(keep[None]).mean() - empty) / (full - empty))
    assert c.meta["acdc"]["forwards"] < keep.size  # fewer forwards than units
    err = capsys.readouterr().err
    assert (f"{c.total_edges}/{c.total_edges}" in err) == positional and (
        "acdc tau=0.02" in err
    ) == positional
    same = overlap(c, c)
    assert same["precision"] == same["recall"] == 1.0
    from probes.circuits import circuit as select

    a = attribute(
        model,
        clean,
        corrupt,
        metric=FN,
        granularity="edge",
        spans=(SPANS >= 2).long(),
        span_names=["a", "b"],
    )
    found = select(a, top_n=len(c.edges), positional=positional)
    o = overlap(found, c)
    units = {(w, r, found.spans[i] if positional else None) for i, (w, r) in enumerate(found.edges)}
    ref = {(w, r, c.spans[i] if positional else None) for i, (w, r) in enumerate(c.edges)}
    assert o["precision"] == len(units & ref) / len(units) and o["recall"] == len(
        units & ref
    ) / len(ref)


@pytest.fixture(scope="module")
def smoke():
    import pe_interp

    torch.manual_seed(0)
    result = pe_interp.train(
        task="distance", encoding="rope", preset="smoke", progress=False, epochs=12, lr=5e-3
    )
    _, task, _ = build_run_configs("distance", "rope", "smoke", 0)
    return result.model.eval(), task


def test_families_give_every_edge_a_positional_and_a_content_score(smoke, tmp_path):
    model, task = smoke
    fams = family_attributions(model, task, 32, kinds=("position", "content"), seed=1)
    pairs = task.counterfactuals(32, kind="content", seed=1)
    direct = attribute(model, pairs, granularity="edge", metric="margin")
    np.testing.assert_allclose(fams["content"].scores, direct.scores, rtol=1e-12, equal_nan=True)
    c = circuit(fams, top_n=10)
    share = c.share("position", "content")
    assert share.shape == (10,) and np.nanmin(share) >= 0 and np.nanmax(share) <= 1
    both = np.abs(c.scores["position"]) + np.abs(c.scores["content"])
    np.testing.assert_allclose(c.ranking, both)  # ranked by the sum of the families
    back = Circuit.load(c.save(tmp_path / "c.json"))
    assert back.edges == c.edges and np.array_equal(back.scores["position"], c.scores["position"])


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_attribution_engine_verifies_the_top_heads_exactly(smoke, method):
    model, task = smoke
    test = task.sample(200, seed=5)
    args = dict(pad_mask=test.pad_mask, method=method, n_bootstrap=50)
    exact = ablate_heads(model, test.tokens, test.labels, **args)
    ranked = ablate_heads(model, test.tokens, test.labels, engine=Attribution(verify_top=3), **args)
    verified = [tuple(h) for h in ranked.meta["verified"]]
    assert len(verified) == 3 and np.isnan(ranked.drops).sum() == exact.drops.size - 3
    for layer, h in verified:
        assert ranked.values[layer, h] == pytest.approx(exact.values[layer, h], abs=1e-12)
    est = np.array(ranked.meta["attribution"])
    assert est.shape == exact.drops.shape and ranked.meta["stand_in"] == "accuracy"
    from probes.ablation.ranking import rank_heads

    again = rank_heads(
        model, test.tokens, test.labels, test.pad_mask, method=method, surrogate="accuracy", steps=4
    )
    np.testing.assert_allclose(
        est, again["estimate"], rtol=1e-12
    )  # the ranking is rank_heads' estimate
    tie = again["tiebreak"]
    order = sorted(
        (-est[layer, h], -tie[layer, h], (layer, h)) for layer in range(2) for h in range(4)
    )
    assert verified == [lh for _, _, lh in order[:3]]
    with pytest.raises(ValueError, match="partial grid"):  # a layer's share needs every head
        find_deposits(ranked)
    with pytest.raises(ValueError):
        ablate_heads(model, test.tokens, test.labels, engine="fast")

"""The ungrouped view of grouped key/value heads (issue 55, item 1): ``kv_view="ungrouped"`` gives
a config-built Llama bridge with 4 query heads on 2 key/value heads, and on 1 (float64), a k and a
v reader per query head, as EAP-IG's ``ungroup_grouped_query_attention`` has it. An edge into
``L1H2.k`` moves what query head 2 reads of its key/value head and nothing else: the view is the
graph of the ungrouped twin (each key/value head copied to every query head of its group, the same
function), which runs none of the view's machinery.

References built here and not by the probes: the grouped view's scores (a key/value head's edge is
the sum of its query heads'), and naive hook loops on the twin's own per-head forks (exact edge
ablation, path patching)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_bridge_gqa_edges import (
    H,
    _ablated_and_naive,
    _bridge,
    _metric,
    _naive_ablation,
    _naive_path_patches,
    _pairs,
)

from probes import attribute, path_patch
from probes.circuits.graph import build_graph, parse, reader_of


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """``{n_kv: (grouped bridge, grouped model, twin bridge, twin model)}`` for 2 and 1 key/value
    heads."""
    out = {}
    for n_kv in (2, 1):
        hf, bridge, model = _bridge(tmp_path_factory, n_kv, seed=5)
        _, twin_bridge, twin = _bridge(tmp_path_factory, H, seed=5, twin_of=hf)
        out[n_kv] = (bridge, model, twin_bridge, twin)
    return out


@pytest.mark.parametrize("n_kv", [2, 1])
def test_the_ungrouped_view_is_the_graph_of_the_twin(twins, n_kv):
    _, model, _, twin = twins[n_kv]
    view, own = build_graph(model.cfg, "ungrouped"), build_graph(twin.cfg)
    assert view.readers == own.readers and np.array_equal(view.valid, own.valid)
    assert view.kv_split == H // n_kv and not view.shared_kv
    assert build_graph(model.cfg).kv_split == 1 and build_graph(twin.cfg, "ungrouped").kv_split == 1
    assert reader_of(1, 3, "k", view) == "L1H3.k" and view.fork_readers(0, "v")[-1] == "L0H3.v"
    from probes.circuits.acdc import acdc
    from probes.circuits.families import exact_edges

    pairs = _pairs()
    for call, who in (
        (lambda: attribute(model, pairs, granularity="edge", kv_view="per-head"), "attribute"),
        (lambda: path_patch(model, pairs, kv_view="per-head"), "path_patch"),
        (lambda: exact_edges(model, pairs, kv_view="per-head"), "exact_edges"),
        (lambda: acdc(model, pairs, kv_view="per-head"), "acdc"),
    ):
        with pytest.raises(ValueError, match=rf"^{who}: kv_view must be one of 'grouped', "):
            call()


@pytest.mark.parametrize("n_kv", [2, 1])
@pytest.mark.parametrize("method", ["atp", "eap-ig", "atp*"])
def test_ungrouped_scores_sum_to_the_grouped_ones_over_each_group(twins, n_kv, method):
    """Every edge into a key/value head's k or v reader is the sum of its query heads' edges in the
    ungrouped view (per position too, for atp and eap-ig); every other edge is the same; and the
    view's scores are the twin's."""
    _, model, _, twin = twins[n_kv]
    pairs = _pairs(1)
    kw = dict(granularity="edge", method=method, steps=3, metric=_metric)
    if method != "atp*":
        kw["by_position"] = True
    grouped = attribute(model, pairs, **kw)
    view = attribute(model, pairs, kv_view="ungrouped", **kw)
    own = attribute(twin, pairs, **kw)
    assert view.meta["kv_view"] == "ungrouped" and grouped.meta["kv_view"] == "grouped"
    graph = build_graph(model.cfg)
    worst, worst_pos = 0.0, 0.0 if method != "atp*" else float("nan")
    for r, reader in enumerate(graph.readers):
        s = parse(reader)
        heads = [None] if s.kv is None else graph.kv_layout.query_heads(s.kv)
        names = [reader if h is None else f"L{s.layer}H{h}.{s.component}" for h in heads]
        rows = [view.readers.index(x) for x in names]
        for w in np.flatnonzero(graph.valid[r]):
            worst = max(worst, abs(grouped.scores[r, w] - view.scores[rows, w].sum()))
            if method != "atp*":
                gap = grouped.by_position[r, w] - view.by_position[rows, w].sum(0)
                worst_pos = max(worst_pos, float(np.abs(gap).max()))
    to_twin = float(np.nanmax(np.abs(view.scores - own.scores)))
    print(
        f"{method}, {n_kv} key/value heads: max |grouped - sum over the group| {worst:.1e} "
        f"(per position {worst_pos:.1e}), max |ungrouped - twin| {to_twin:.1e}, max |score| "
        f"{np.nanmax(np.abs(view.scores)):.1e}"
    )
    assert worst <= 1e-8 and not worst_pos > 1e-8 and to_twin <= 1e-8, (worst, worst_pos, to_twin)
    assert np.isnan(view.scores).sum() == (~build_graph(twin.cfg).valid).sum()


def test_ungrouped_edge_ablation_equals_a_naive_hook_loop_on_the_twin(twins):
    """Each edge into a query head's own k or v reader ablated alone, then a set across both
    layers, then everything outside a 12-edge circuit of the view (faithfulness_curve, and the
    circuit record saved and loaded): the grouped model's metric under the view, against the
    twin's own per-head forks swapped by a naive hook loop."""
    from probes import Circuit
    from probes.circuits.faithfulness import faithfulness_curve
    from probes.circuits.selection import rank_edges

    for n_kv in (2, 1):
        _, model, twin_bridge, _ = twins[n_kv]
        pairs = _pairs(2)
        graph = build_graph(model.cfg, "ungrouped")
        kv_edges = [
            (graph.writers[w], r)
            for r in graph.readers
            if parse(r).component in ("k", "v")
            for w in np.flatnonzero(graph.valid[graph.reader_index(r)])
        ]
        mixed = [("embed", "L0H1.k"), ("L0H1", "L1H3.v"), ("L0H2", "L1H0.k"), ("MLP0", "L1H3.q")]
        sets = [[e] for e in kv_edges] + [mixed + [("L0H3", "MLP1"), ("L1H2", "logits")]]
        got, want, tk = _ablated_and_naive(model, twin_bridge, graph, pairs, sets)
        worst = float((got - want).abs().max())
        ranking = rank_edges(
            attribute(model, pairs, granularity="edge", metric=_metric, kv_view="ungrouped")
        )
        circuit = ranking.circuit(12)
        assert circuit.kv_view == "ungrouped" and ranking.graph.readers == graph.readers
        mask = circuit.keep_mask(graph)[..., 0]
        outside = [
            (graph.writers[w], graph.readers[r]) for r, w in zip(*np.nonzero(graph.valid & ~mask))
        ]
        naive = float(_naive_ablation(twin_bridge, graph, pairs.clean, tk, outside).mean())
        curve = faithfulness_curve(model, ranking, pairs, sizes=[12], metric=_metric)
        back = Circuit.from_dict(json.loads(json.dumps(circuit.to_dict())))
        again = faithfulness_curve(model, back, pairs, sizes=[12], metric=_metric)
        gaps = [abs(x["metric"][0] - naive) for x in (curve, again)]
        print(
            f"{n_kv} key/value heads: {len(sets)} ablations, max |ablated_metric - naive twin| "
            f"{worst:.1e}; circuit of {len(circuit.edges)}: |faithfulness - naive| {max(gaps):.1e}"
        )
        assert worst <= 1e-8 and max(gaps) <= 1e-8, (worst, gaps)
        assert back.kv_view == "ungrouped" and curve["total_edges"] == graph.n_edges
        assert sum(1 for _, r in circuit.edges if "KV" in r) == 0


def test_ungrouped_path_patching_equals_a_naive_hook_loop_on_the_twin(twins):
    """Each sender's clean term patched into one query head's own k or v (and a q, an MLP and the
    readout) of the corrupt run, under the view; against the twin's per-head fork, run naively.
    ``exact_edges`` and the head route read the same receivers."""
    from probes.circuits.families import exact_edges
    from probes.circuits.route import HeadRoute, head_route

    _, model, twin_bridge, _ = twins[2]
    graph = build_graph(model.cfg, "ungrouped")
    pairs = _pairs(4)
    receivers = {"q": ["L1H2.q", "MLP0", "logits"], "k": ["L1H1", "L1H2.k"], "v": ["L1H3.v"]}
    pp = {
        x: path_patch(model, pairs, None, None, r, x, metric=_metric, kv_view="ungrouped")
        for x, r in receivers.items()
    }
    assert pp["k"].receivers == ("L1H1.k", "L1H2.k") and pp["k"].meta["kv_view"] == "ungrouped"
    worst, n = _naive_path_patches(twin_bridge, graph, pairs, pp.values())
    print(f"ungrouped view: {n} path patches, max |path_patch - naive twin| {worst:.1e}")
    assert n == 4 * 6 + 5 + 11 and worst <= 1e-8, worst  # MLP0 reads 5 writers, the readout 11

    class Task:  # a task whose pairs cost nothing
        def counterfactuals(self, n, kind, seed):
            return pairs

    route = head_route(model, Task(), "L1H1", n=6, kinds=("position",), kv_view="ungrouped")
    assert route.kv_view == "ungrouped" == HeadRoute.from_dict(route.to_dict()).kv_view
    exact = route.exact["position"]["k"]
    direct = path_patch(
        model, pairs, None, list(exact), ["L1H1.k"], "k", metric="margin", kv_view="ungrouped"
    )
    assert max(abs(exact[s] - direct.effect(s, "L1H1.k")) for s in exact) <= 1e-12
    scores = exact_edges(model, pairs, metric=_metric, kv_view="ungrouped")
    assert scores.readers == graph.readers
    r, w = graph.reader_index("L1H2.k"), graph.writer_index("L0H1")
    assert abs(scores.scores[r, w] - pp["k"].effect("L0H1", "L1H2.k")) <= 1e-12


def test_acdc_learned_masks_and_the_view_run_on_the_ungrouped_view(twins):
    """ACDC's circuit (exact ablations, held to the twin above) measures the same again by
    faithfulness_curve under its own record's view; learned masks run; the page draws each query
    head's own k and v, and no key/value head."""
    from probes.circuits.acdc import acdc
    from probes.circuits.faithfulness import faithfulness_curve
    from probes.circuits.learned import learn_ranking
    from probes.circuits.view import circuit_html, circuit_summary

    _, model, _, _ = twins[1]
    pairs = _pairs(3)
    found = acdc(model, pairs, tau=0.02, metric=_metric, kv_view="ungrouped")
    assert found.edges and found.kv_view == "ungrouped"
    curve = faithfulness_curve(model, found, pairs, sizes=[len(found.edges)], metric=_metric)
    assert abs(curve["recovered"][0] - found.faithfulness["kept"]) <= 1e-9
    ranking = learn_ranking(model, pairs, steps=4, metric=_metric, kv_view="ungrouped")
    assert ranking.graph.kv_view == "ungrouped"
    assert np.isfinite(ranking.meta["learned"]["recovered_hard"])
    page = circuit_html(found)
    assert "KV" not in "".join(found.nodes)
    assert "k/v readers per query head" in circuit_summary(found)
    assert all(f">{n}<" in page for n in found.nodes)
    old = {k: v for k, v in found.to_dict().items() if k != "kv_view"}  # a record from before
    assert type(found).from_dict(old).kv_view == "grouped"


def test_pe_interp_circuit_takes_the_ungrouped_view(tmp_path, capsys):
    """``pe-interp circuit --kv-view ungrouped`` on a saved 4-on-2 Llama: the record says its view,
    its k/v edges and its route name query heads (no key/value head), and each kept edge's
    position score is the probe's own under that view; a view it does not know is refused."""
    from test_bad_inputs_models import tiny_model

    from pe_interp.cli import main
    from pe_interp.runs.model_dirs import load_model_dir
    from probes import Circuit, family_attributions

    model_dir = tiny_model(tmp_path / "model")
    argv = ["circuit", str(model_dir), "--task", "induction", "--preset", "smoke", "--whole-edges"]
    argv += ["--n", "8", "--top-n", "6", "--method", "atp", "--out", str(tmp_path / "out")]
    assert main([*argv, "--kv-view", "ungrouped"]) == 0
    assert "k/v readers per query head" in capsys.readouterr().out
    c = Circuit.load(tmp_path / "out" / "circuit.json")
    readers = {r for _, r in c.edges}
    assert c.kv_view == "ungrouped" and any(r.endswith((".k", ".v")) for r in readers)
    # edges into layer 0's q/k/v readers, MLP0, layer 1's readers, MLP1, the readout
    assert not any("KV" in r for r in readers) and c.total_edges == 12 + 5 + 12 * 6 + 10 + 11
    loaded = load_model_dir(model_dir, task="induction", preset="smoke")
    fams = family_attributions(
        loaded.model, loaded.task, 8, method="atp", metric="margin", kv_view="ungrouped"
    )
    want = [fams["position"].edge(w, r) for w, r in c.edges]
    assert np.allclose(c.scores["position"], want, rtol=0, atol=1e-6), (c.scores, want)
    with pytest.raises(SystemExit):
        main([*argv, "--kv-view", "per-head"])
    assert "argument --kv-view: invalid choice: 'per-head'" in capsys.readouterr().err


def test_eap_ig_stacks_its_steps_within_the_batch_size_counting_the_copies(twins):
    """EAP-IG stacks its steps on the batch: under the ungrouped view each step's rows run once per
    query head of a group, and the rows of one forward stay within ``batch_size``; the scores do
    not depend on how the steps are stacked."""
    bridge, model, _, _ = twins[1]  # 4 query heads on 1 key/value head: 4 copies of each row
    pairs = _pairs(2)
    widest = []
    handle = bridge.blocks[0].ln1.register_forward_pre_hook(
        lambda mod, args: widest.append(int(args[0].shape[0]))
    )
    kw = dict(granularity="edge", method="eap-ig", steps=4, metric=_metric, kv_view="ungrouped")
    try:
        one_a_forward = attribute(model, pairs, batch_size=4 * len(pairs.clean.tokens), **kw)
        stacked = max(widest)
        widest.clear()
        all_stacked = attribute(model, pairs, batch_size=16 * len(pairs.clean.tokens), **kw)
    finally:
        handle.remove()
    n = len(pairs.clean.tokens)
    assert stacked == 4 * n and max(widest) == 16 * n  # one step, then all four, a forward
    assert np.allclose(one_a_forward.scores, all_stacked.scores, rtol=0, atol=1e-12, equal_nan=True)

"""Connected and position-aware circuits: pruning and widest paths against an explicit graph of
(node, span) states searched by networkx, the orders' circuits, spans of the tasks, and
attribution per span against per-position attribution summed by hand."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
import torch
from circuit_env import random_model, random_pairs

from pe_interp import ModelConfig
from pe_interp.config.presets import build_run_configs
from probes import attribute
from probes.circuits import Circuit, circuit, prune, rank_edges
from probes.circuits.graph import build_graph, parse
from probes.circuits.paths import widest_paths

FN = lambda logits, good, bad: logits[:, 1] - logits[:, 0]  # noqa: E731


def state_graph(graph, S: int, weight=None) -> nx.DiGraph:
    """Writers and readers at each span; a unit is a writer -> reader arc at its span; a head's
    q reader feeds its output at the same span, its k and v readers at every span."""
    g = nx.DiGraph()
    R, W = graph.valid.shape
    for i, j in zip(*np.nonzero(graph.valid)):
        for s in range(S):
            if weight is None or weight[i, j, s] is not None:
                g.add_edge(("w", j, s), ("r", i, s), unit=(i, j, s))
    for j, w in enumerate(graph.writers[1:], start=1):
        if parse(w).kind == "head":
            for s in range(S):
                g.add_edge(("r", graph.reader_index(f"{w}.q"), s), ("w", j, s))
                for c, t in itertools.product("kv", range(S)):
                    g.add_edge(("r", graph.reader_index(f"{w}.{c}"), t), ("w", j, s))
        else:
            for s in range(S):
                g.add_edge(("r", graph.reader_index(w), s), ("w", j, s))
    for s in range(S):
        g.add_edge("source", ("w", 0, s))
        g.add_edge(("r", graph.reader_index("logits"), s), "sink")
    return g


@pytest.mark.parametrize("kv_source", ["residual", "embed"])
def test_prune_keeps_exactly_the_units_on_source_to_sink_paths(kv_source):
    cfg = ModelConfig(
        n_layers=3,
        d_model=8,
        n_heads=2,
        d_mlp=8,
        d_vocab=10,
        n_classes=3,
        n_ctx=6,
        kv_source=kv_source,
    )
    graph = build_graph(cfg)
    S = 3
    rng = np.random.default_rng(0)
    for trial in range(20):
        keep = (rng.random((*graph.valid.shape, S)) < (0.1 + 0.04 * trial)) & graph.valid[..., None]
        g = state_graph(graph, S)
        g.remove_edges_from(
            [(a, b) for a, b, d in g.edges(data=True) if "unit" in d and not keep[d["unit"]]]
        )
        reach = nx.descendants(g, "source")
        back = nx.ancestors(g, "sink")
        want = np.zeros_like(keep)
        for a, b, d in g.edges(data=True):
            if "unit" in d and a in reach and b in back:
                want[d["unit"]] = True
        assert np.array_equal(prune(graph, keep), want), trial


def test_widest_path_is_the_best_bottleneck_over_all_paths():
    cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_mlp=0, d_vocab=10, n_classes=3, n_ctx=6)
    graph = build_graph(cfg)
    S = 2
    rank = np.random.default_rng(1).random((*graph.valid.shape, S))
    rank = np.where(graph.valid[..., None], rank, np.nan)
    g = state_graph(graph, S)
    best = np.full(rank.shape, -np.inf)
    for path in nx.all_simple_paths(g, "source", "sink"):
        units = [g.edges[a, b]["unit"] for a, b in zip(path, path[1:]) if "unit" in g.edges[a, b]]
        width = min(rank[u] for u in units)
        for u in units:
            best[u] = max(best[u], width)
    np.testing.assert_allclose(widest_paths(graph, rank), best)


@pytest.fixture(scope="module")
def scored():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    ids = torch.tensor(
        [[0, 0, 1, 2, 2, 2, 3, 3], [0, 1, 1, 2, 2, 3, 3, 3], [0, 0, 1, 1, 2, 2, 2, 3]]
    )
    a = attribute(
        model,
        clean,
        corrupt,
        metric=FN,
        granularity="edge",
        spans=ids,
        span_names=["a", "b", "c", "d"],
    )
    return model, clean, corrupt, ids, a


def test_orders_give_connected_nested_circuits(scored):
    model, _, _, _, a = scored
    graph = build_graph(model.cfg)
    for positional, select in itertools.product((False, True), ("paths", "greedy")):
        r = rank_edges(a, select=select, positional=positional)
        assert r.total == graph.n_edges * (4 if positional else 1)
        prev = None
        for n in range(0, r.total + 1, 7):
            k = r.keep(n)
            assert np.array_equal(prune(graph, k), k)  # connected
            if select == "paths":
                assert k.sum() == n or np.isclose(
                    r.value[n - 1], r.value[n]
                )  # only ties are pruned
                assert prev is None or (prev <= k).all()  # nested
            prev = k
    r = rank_edges(a, select="paths")
    value = widest_paths(graph, np.abs(a.scores)[..., None]).ravel()[r.order]
    assert np.all(np.diff(value) <= 0)  # by widest path
    top = rank_edges(a, select="top")
    assert np.all(np.diff(np.abs(a.scores)[..., None].ravel()[top.order]) <= 0)


def test_positional_circuit_keeps_edges_per_span_and_saves(scored, tmp_path):
    model, _, _, _, a = scored
    c = circuit(a, top_n=12, positional=True)
    r = rank_edges(a, positional=True)
    m = r.prefix_for(12)  # the longest prefix of the order with at most 12 units once pruned
    assert r.keep(m).sum() == len(c.edges) <= 12 < r.keep(m + 1).sum()
    assert c.positional and len(c.spans) == len(c.edges) and set(c.spans) <= {"a", "b", "c", "d"}
    graph = build_graph(model.cfg)
    for i, (w, r) in enumerate(c.edges):
        s = c.span_names.index(c.spans[i])
        assert c.scores["score"][i] == a.by_span[graph.reader_index(r), graph.writer_index(w), s]
    keep = c.keep_mask(graph)
    assert keep.sum() == len(c.edges) and np.array_equal(prune(graph, keep), keep)
    back = Circuit.load(c.save(tmp_path / "c.json"))
    assert back.spans == c.spans and back.edges == c.edges and back.span_names == c.span_names
    assert back.label(0).endswith(f"@ {c.spans[0]}")
    with pytest.raises(ValueError, match="per span"):
        circuit(
            attribute(model, *random_pairs(), metric=FN, granularity="edge"),
            top_n=3,
            positional=True,
        )


def test_task_spans_follow_the_generator():
    _, task, _ = build_run_configs("distance", "rope", "quick", 0)
    pairs = task.counterfactuals(64, kind="position", seed=0)
    t1, t2 = task.triggers
    for batch in (pairs.clean, pairs.corrupt):
        ids = task.spans(batch)
        for i in range(len(batch)):
            tok, n = batch.tokens[i], int(batch.lengths[i])
            first, second = int((tok == t1).nonzero()[0, 0]), int((tok == t2).nonzero()[0, 0])
            assert second - first == int(batch.labels[i]) + 2
            want = (
                [0] * first
                + [1]
                + [2] * (second - first - 1)
                + [3]
                + [4] * (n - second - 1)
                + [5] * (len(tok) - n)
            )
            assert ids[i].tolist() == want
    _, count, _ = build_run_configs("count", "rope", "quick", 0)
    b = count.sample(16, seed=1)
    ids = count.spans(b)
    assert (
        torch.equal(ids == 0, torch.isin(b.tokens, count.trigger_ids))
        and int((ids == 0).sum(1)[0]) == int(b.labels[0]) + count.min_count
    )
    with pytest.raises(ValueError, match="labelled distance"):
        bad = pairs.clean[:2]
        task.spans(type(bad)(bad.tokens, (bad.labels + 1) % task.n_classes, bad.pad_mask))


@pytest.mark.parametrize("method", ["atp", "eap-ig"])
def test_scores_per_span_are_per_position_scores_summed_by_hand(scored, method):
    model, clean, corrupt, ids, _ = scored
    for gran in ("edge", "node"):
        a = attribute(
            model,
            clean,
            corrupt,
            metric=FN,
            granularity=gran,
            method=method,
            spans=ids,
            batch_size=2,
            steps=3,
        )
        assert a.span_names == ("span0", "span1", "span2", "span3")
        want = np.zeros(a.by_span.shape)
        for i in range(len(clean)):
            one = attribute(
                model,
                clean[i : i + 1],
                corrupt[i : i + 1],
                metric=FN,
                granularity=gran,
                method=method,
                by_position=True,
                steps=3,
            )
            for s in range(4):
                want[..., s] += np.where((ids[i] == s).numpy(), one.by_position, 0.0).sum(-1) / len(
                    clean
                )
        np.testing.assert_allclose(a.by_span, want, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(a.by_span.sum(-1), a.scores, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="spans must be integer"):
        attribute(model, clean, corrupt, metric=FN, spans=ids[:, :3])
    with pytest.raises(ValueError, match="atp\\*"):
        attribute(model, clean, corrupt, metric=FN, method="atp*", granularity="edge", spans=ids)

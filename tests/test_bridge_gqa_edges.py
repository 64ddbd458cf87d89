"""Edges on grouped and multi-query key/value heads (issue 55, item 1): a config-built Llama bridge
with 4 query heads on 2 key/value heads, and on 1, in float64.

The edge graph has a q reader per query head and a k and a v reader per key/value head
(``L{l}KV{g}.k|v``). References built here and not by the probes: finite differences of the
metric with a writer's clean-minus-corrupt term (times eps) added to one key/value head's slot of
``hook_k_input``/``hook_v_input`` (and one query head's of ``hook_q_input``), run through the
bridge's own forward; a naive hook loop that swaps writers' terms in those slots for exact edge
ablation; and an ungrouped twin (every key/value head copied to each query head of its group),
whose per-query-head k/v edges sum to the grouped ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_interp.models.bridge.forward import check_edges
from pe_interp.models.bridge.hf_arch import (
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.tasks.batch import Batch, CounterfactualPairs
from probes import attribute, path_patch
from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.engine import as_pair, capture, contributions, forks, writer_hooks
from probes.circuits.graph import Site, build_graph, parse, reader_of

V, PAD, P, N = 64, 0, 8, 6
ANSWERS = [60, 61, 62, 63]
SHAPE = dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=32, d_vocab=V, pad_id=PAD)
H = SHAPE["n_heads"]
D = SHAPE["d_model"] // H


def _metric(logits, good, bad):
    """Nonlinear in the logits: the clean answer's log-probability among the answers."""
    return logits.log_softmax(-1).gather(1, good[:, None])[:, 0].double()


def _bridge(tmp_path_factory, n_kv: int, seed: int = 3, twin_of=None):
    hf = build_hf_model("llama", seed=seed, n_kv_heads=n_kv, **SHAPE)
    if twin_of is not None:  # every key/value head copied to each query head of its group
        state = twin_of.state_dict()
        group = H // twin_of.config.num_key_value_heads
        for name, w in list(state.items()):
            if name.endswith(("k_proj.weight", "v_proj.weight")):
                state[name] = w.view(-1, D, w.shape[-1]).repeat_interleave(group, 0).flatten(0, 1)
        hf.load_state_dict(state)
    out = save_model_dir(hf, word_tokenizer(V, PAD), tmp_path_factory.mktemp(f"kv{n_kv}") / "m")
    bridge = boot_bridge(out)
    bridge.to(torch.float64)
    return hf, bridge, BridgedModel(bridge, answers=ANSWERS)


@pytest.fixture(scope="module", params=[2, 1], ids=["4-on-2", "4-on-1"])
def grouped(request, tmp_path_factory):
    return _bridge(tmp_path_factory, request.param)


def _pairs(seed: int = 0) -> CounterfactualPairs:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, P + 1, (N,), generator=g)
    mask = torch.arange(P)[None] < lengths[:, None]
    clean = torch.randint(1, 60, (N, P), generator=g) * mask
    corrupt = torch.randint(1, 60, (N, P), generator=g) * mask
    good = torch.randint(0, 4, (N,), generator=g)
    return CounterfactualPairs(Batch(clean, good, mask), Batch(corrupt, (good + 1) % 4, mask))


def _last(logits, mask):
    return logits[torch.arange(len(mask)), mask.sum(1) - 1][:, ANSWERS]


def _terms(bridge, graph, tokens, mask):
    """Every writer's residual term ``{name: [b, p, d]}``, from the bridge's own cache."""
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, attention_mask=mask.long())
    out = {"embed": cache[graph.embed_hook]}
    for layer in range(graph.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        for h in range(H):
            out[f"L{layer}H{h}"] = z[:, :, h] @ bridge.blocks[layer].attn.W_O[h]
        out[f"MLP{layer}"] = cache[f"blocks.{layer}.hook_mlp_out"]
    return out


def _fork(reader: str) -> tuple[str, int]:
    """A q/k/v reader's hook and its slot in the fork."""
    s = parse(reader)
    return f"blocks.{s.layer}.attn.hook_{s.component}_input", s.head if s.kv is None else s.kv


def _run(bridge, tokens, mask, hooks):
    """The bridge's logits with its forks on and ``hooks``."""
    bridge.set_use_split_qkv_input(True)
    try:
        logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks, attention_mask=mask.long())
    finally:
        bridge.set_use_split_qkv_input(False)
    return logits


def test_the_graph_has_a_k_and_a_v_reader_per_key_value_head(grouped):
    hf, bridge, model = grouped
    n_kv = hf.config.num_key_value_heads
    assert check_edges(bridge, V) is None
    graph = build_graph(model.cfg)
    assert graph.grouped and graph.kv_layout.n_kv_heads == n_kv
    for layer in range(2):
        assert graph.fork_readers(layer, "q") == [f"L{layer}H{h}.q" for h in range(H)]
        for c in "kv":
            assert graph.fork_readers(layer, c) == [f"L{layer}KV{g}.{c}" for g in range(n_kv)]
            for h in range(H):  # each query head reads its group's key/value head
                assert reader_of(layer, h, c, graph) == f"L{layer}KV{h // (H // n_kv)}.{c}"
    assert parse("L1KV0.k") == Site("input", 1, None, "k", 0)
    assert parse("L1KV0.k").head_node is None and parse("L1KV0.v").node == "L1KV0"
    assert parse("L1KV0") == Site("kv", 1, kv=0)
    assert not any(".k" in r and "H" in r for r in graph.readers)
    # a layer-1 key/value head reads the embedding and every layer-0 writer, layer 0 the embedding
    assert graph.valid[graph.reader_index("L1KV0.k")].sum() == 1 + H + 1
    assert graph.valid[graph.reader_index("L0KV0.v")].tolist() == [True] + [False] * (2 * H + 2)


def _slope(bridge, tokens, mask, good, bad, reader, delta, embed=None):
    """``(exact, finite)``: d(mean metric)/d eps at 0 of the forward of ``tokens`` with ``eps *
    delta`` added to the reader's fork slot, by autograd on ``eps`` (the limit finite differences
    approach) and by central differences at eps = 1e-3 (the bridge's softmax rounds to float32,
    which a smaller step would amplify); ``embed`` replaces the layer-0 input."""
    hook, slot = _fork(reader)

    def metric(eps):
        def add(x, hook):
            x = x.clone()
            x[:, :, slot] += eps * delta
            return x

        hooks = [(hook, add)]
        if embed is not None:
            hooks.insert(0, ("blocks.0.hook_resid_pre", lambda x, hook: embed))
        return _metric(_last(_run(bridge, tokens, mask, hooks), mask), good, bad).mean()

    eps = torch.zeros((), dtype=torch.float64, requires_grad=True)
    (exact,) = torch.autograd.grad(metric(eps), [eps])
    with torch.no_grad():
        finite = (metric(1e-3) - metric(-1e-3)) / 2e-3
    return float(exact), float(finite)


@pytest.mark.parametrize("method", ["atp", "eap-ig"])
def test_edge_attribution_equals_finite_differences_at_each_key_value_head(grouped, method):
    """Denoising AtP (and EAP-IG, 3 steps) of every edge into the attention forks of both layers:
    the writer's clean-minus-corrupt term added to that one slot of the fork, in the corrupt run
    (for EAP-IG: in the corrupt run with its layer-0 input moved step by step to the clean one)."""
    _, bridge, model = grouped
    pairs = _pairs()
    graph = build_graph(model.cfg)
    steps = 3
    got = attribute(model, pairs, granularity="edge", method=method, steps=steps, metric=_metric)
    c, k = pairs.clean, pairs.corrupt
    mask = c.pad_mask
    tc, tk = _terms(bridge, graph, c.tokens, mask), _terms(bridge, graph, k.tokens, mask)
    alphas = [None] if method == "atp" else [(s + 1) / steps for s in range(steps)]
    worst, worst_fd, checked = 0.0, 0.0, 0
    for reader in graph.readers:
        if parse(reader).kind != "input":
            continue
        for w in np.flatnonzero(graph.valid[graph.reader_index(reader)]):
            writer = graph.writers[w]
            delta = tc[writer] - tk[writer]
            exact, finite = np.mean(
                [
                    _slope(
                        bridge,
                        k.tokens,
                        mask,
                        c.labels,
                        k.labels,
                        reader,
                        delta,
                        None if a is None else tk["embed"] + a * (tc["embed"] - tk["embed"]),
                    )
                    for a in alphas
                ],
                axis=0,
            )
            score = got.edge(writer, reader)
            worst = max(worst, abs(score - exact))
            worst_fd = max(worst_fd, abs(score - finite))
            checked += 1
    n_kv = graph.kv_layout.n_kv_heads
    assert checked == (H + 2 * n_kv) * (1 + (H + 2))  # layer 0 reads the embedding, layer 1 more
    print(
        f"{method}, {n_kv} key/value heads: {checked} edges, max |score - d/deps| {worst:.1e}, "
        f"max |score - finite difference| {worst_fd:.1e}, max |score| {np.nanmax(np.abs(got.scores)):.1e}"
    )
    assert worst <= 1e-7 and worst_fd <= 1e-5, (worst, worst_fd)  # the softmax is float32
    # the chain rule through every fork, key/value heads included: each writer's edges add up to
    # its node score
    nodes = attribute(model, pairs, method=method, steps=steps, metric=_metric)
    np.testing.assert_allclose(np.nansum(got.scores, axis=0), nodes.scores, atol=1e-7, rtol=0)
    assert np.isnan(got.scores).sum() == (~graph.valid).sum()


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The 4-on-2 and 4-on-1 bridges, each with its ungrouped twin."""
    out = {}
    for n_kv in (2, 1):
        hf, bridge, model = _bridge(tmp_path_factory, n_kv, seed=5)
        out[n_kv] = (model, _bridge(tmp_path_factory, H, seed=5, twin_of=hf)[2])
    return out


@pytest.mark.parametrize("n_kv", [2, 1])
@pytest.mark.parametrize("method", ["atp", "eap-ig", "atp*"])
def test_a_key_value_heads_edges_are_the_sums_of_its_query_heads_in_the_ungrouped_twin(
    twins, n_kv, method
):
    """The twin copies each key/value head to every query head of its group: the same function,
    with one k and one v fork per query head. A key/value head's edge is the sum of its query
    heads' (the chain rule for atp and eap-ig; for atp*, whose recomputed softmax of query head h
    moves with its own key only, the sum of the group's pattern terms); q edges are equal."""
    grouped, twin = twins[n_kv]
    pairs = _pairs(1)
    with torch.no_grad():
        a, b = (
            grouped(pairs.clean.tokens, pairs.clean.pad_mask),
            twin(pairs.clean.tokens, pairs.clean.pad_mask),
        )
    assert float((a - b).abs().max()) <= 1e-6  # the same model
    kw = dict(granularity="edge", method=method, steps=3, metric=_metric)
    g, t = attribute(grouped, pairs, **kw), attribute(twin, pairs, **kw)
    graph = build_graph(grouped.cfg)
    worst = 0.0
    for r, reader in enumerate(graph.readers):
        s = parse(reader)
        for w in np.flatnonzero(graph.valid[r]):
            writer = graph.writers[w]
            if s.kv is None:
                want = t.edge(writer, reader)
            else:
                group = graph.kv_layout.query_heads(s.kv)
                want = sum(t.edge(writer, f"L{s.layer}H{h}.{s.component}") for h in group)
            worst = max(worst, abs(g.edge(writer, reader) - want))
    print(
        f"{method}, {n_kv} key/value heads: max |grouped - sum over the twin's group| {worst:.1e}"
    )
    assert worst <= 1e-7, worst


def _naive_ablation(bridge, graph, clean, corrupt_terms, ablated):
    """Per-example metric of the clean run where each ``(writer, reader)`` in ``ablated`` has the
    reader read the writer's corrupt term instead of its live one: hooks that record every
    writer's live term and, at each reader's hook (its slot of a q/k/v fork), add corrupt minus
    live."""
    live = {}
    by_hook: dict[str, list] = {}
    for writer, reader in ablated:
        s = parse(reader)
        if s.kind == "input":
            hook, slot = _fork(reader)
        elif s.kind == "mlp":
            hook, slot = f"blocks.{s.layer}.{graph.mlp_in_hook}", None
        else:
            hook, slot = f"blocks.{graph.n_layers - 1}.hook_resid_post", None
        by_hook.setdefault(hook, []).append((slot, writer))

    def record(x, hook, layer, what):
        if what == "embed":
            live["embed"] = x
        elif what == "z":
            for h in range(H):
                live[f"L{layer}H{h}"] = x[:, :, h] @ bridge.blocks[layer].attn.W_O[h]
        else:
            live[f"MLP{layer}"] = x
        return x

    def swap(x, hook, name):
        x = x.clone()
        for slot, writer in by_hook[name]:
            d = corrupt_terms[writer] - live[writer]
            if slot is None:
                x += d
            else:
                x[:, :, slot] += d
        return x

    hooks = [(graph.embed_hook, lambda x, hook: record(x, hook, 0, "embed"))]
    for layer in range(graph.n_layers):
        hooks.append(
            (f"blocks.{layer}.attn.hook_z", lambda x, hook, i=layer: record(x, hook, i, "z"))
        )
        hooks.append(
            (f"blocks.{layer}.hook_mlp_out", lambda x, hook, i=layer: record(x, hook, i, "mlp"))
        )
    hooks += [(name, lambda x, hook, n=name: swap(x, hook, n)) for name in by_hook]
    mask = clean.pad_mask
    with torch.no_grad():
        logits = _run(bridge, clean.tokens, mask, hooks)
    return _metric(_last(logits, mask), clean.labels, None)


def _ablated_and_naive(model, bridge, graph, pairs, sets):
    """``(ablated_metric, naive loop)``, ``[sets, n]`` each: the clean run with each set of edges
    reading the corrupt run's terms, by the probe on ``model`` and by :func:`_naive_ablation` on
    ``bridge``; and the corrupt terms. Every set moves the metric."""
    c, k = as_pair(model, pairs, None)
    tk = _terms(bridge, graph, pairs.corrupt.tokens, pairs.corrupt.pad_mask)
    keep = np.ones((len(sets), *graph.valid.shape), dtype=bool)
    for j, edges in enumerate(sets):
        for w, r in edges:
            keep[j, graph.reader_index(r), graph.writer_index(w)] = False
    with forks(model), torch.no_grad():
        repl = contributions(model, graph, capture(model, k, writer_hooks(graph))[0])
        got = ablated_metric(
            model, graph, c, repl, torch.as_tensor(keep), _metric, c.labels, k.labels
        )
    want = torch.stack([_naive_ablation(bridge, graph, pairs.clean, tk, e) for e in sets])
    clean = _naive_ablation(bridge, graph, pairs.clean, tk, [])
    assert float((want - clean[None]).abs().amax(1).min()) > 1e-6  # every ablation matters
    return got, want, tk


def test_exact_edge_ablation_equals_a_naive_hook_loop_at_each_key_value_head(grouped):
    """Every edge into a key/value head's k or v reader ablated alone, then a set of edges across
    both layers (an ablated layer-0 edge moves the live terms the layer-1 readers then swap), then
    every edge outside a 12-edge circuit (faithfulness_curve's measurement of it): the metric of
    the clean run with the readers reading the corrupt run's terms, against a naive hook loop."""
    from probes.circuits.faithfulness import faithfulness_curve
    from probes.circuits.selection import rank_edges

    _, bridge, model = grouped
    pairs = _pairs(2)
    graph = build_graph(model.cfg)
    kv_edges = [
        (graph.writers[w], r)
        for r in graph.readers
        if parse(r).kv is not None
        for w in np.flatnonzero(graph.valid[graph.reader_index(r)])
    ]
    n_kv = graph.kv_layout.n_kv_heads
    mixed = [
        ("embed", "L0KV0.k"),
        ("L0H1", f"L1KV{n_kv - 1}.v"),
        ("L0H2", "L1KV0.k"),
        ("embed", "L1KV0.k"),
        ("MLP0", "L1H3.q"),
        ("L0H3", "MLP1"),
        ("L1H2", "logits"),
    ]
    sets = [[e] for e in kv_edges] + [mixed]
    got, want, tk = _ablated_and_naive(model, bridge, graph, pairs, sets)
    worst = float((got - want).abs().max())
    # a circuit of 12 edges, the rest ablated, measured by faithfulness_curve
    ranking = rank_edges(attribute(model, pairs, granularity="edge", metric=_metric))
    circuit = ranking.circuit(12)
    mask = circuit.keep_mask(graph)[..., 0]
    outside = [
        (graph.writers[w], graph.readers[r]) for r, w in zip(*np.nonzero(graph.valid & ~mask))
    ]
    curve = faithfulness_curve(model, circuit, pairs, sizes=[len(circuit.edges)], metric=_metric)
    naive = float(_naive_ablation(bridge, graph, pairs.clean, tk, outside).mean())
    print(
        f"{n_kv} key/value heads: {len(sets)} ablations, max |ablated_metric - naive| {worst:.1e}; "
        f"circuit of {len(circuit.edges)}: |faithfulness_curve metric - naive| "
        f"{abs(curve['metric'][0] - naive):.1e}"
    )
    assert worst <= 1e-9, worst
    assert abs(curve["metric"][0] - naive) <= 1e-9


def test_a_key_value_heads_readers_stay_on_a_path_while_one_head_of_its_group_is_used(grouped):
    """Selection's pruning: ``embed -> L0KV0.k`` feeds every head of its group, so it lies on a
    path to the logits when any one of them does, whichever head of the group it is."""
    from probes.circuits.paths import prune

    graph = build_graph(grouped[2].cfg)
    for h in graph.kv_layout.query_heads(0):
        keep = np.zeros((*graph.valid.shape, 1), dtype=bool)
        for w, r in (("embed", "L0KV0.k"), (f"L0H{h}", "logits")):
            keep[graph.reader_index(r), graph.writer_index(w), 0] = True
        assert prune(graph, keep).sum() == 2, h


def test_acdc_learned_masks_and_the_circuit_view_run_on_key_value_heads(grouped):
    """ACDC's circuit (its faithfulness from the exact ablations of edge_ablation, held to a naive
    loop above) measures the same again by faithfulness_curve; learned masks run; the view draws a
    key/value head as a node of its own."""
    from probes.circuits.acdc import acdc
    from probes.circuits.faithfulness import faithfulness_curve
    from probes.circuits.learned import learn_ranking
    from probes.circuits.view import circuit_html

    _, _, model = grouped
    pairs = _pairs(3)
    found = acdc(model, pairs, tau=0.02, metric=_metric)
    assert found.edges
    curve = faithfulness_curve(model, found, pairs, sizes=[len(found.edges)], metric=_metric)
    assert abs(curve["recovered"][0] - found.faithfulness["kept"]) <= 1e-9
    ranking = learn_ranking(model, pairs, steps=4, metric=_metric)
    assert np.isfinite(ranking.meta["learned"]["recovered_hard"])
    c = rank_edges_circuit(model, pairs)
    page = circuit_html(c)
    kv_nodes = [n for n in c.nodes if parse(n).kind == "kv"]
    assert kv_nodes and all(f">{n}<" in page for n in kv_nodes)


def rank_edges_circuit(model, pairs):
    """The top 40 edges by AtP (no pruning), a circuit that reads key/value heads."""
    from probes.circuits.selection import rank_edges

    return rank_edges(
        attribute(model, pairs, granularity="edge", metric=_metric), select="top"
    ).circuit(40)


def _naive_path_patches(bridge, graph, pairs, results) -> tuple[float, int]:
    """``(max |path_patch - naive|, edges)`` over the :class:`PathPatch` ``results``: each sender's
    clean-minus-corrupt term (``bridge``'s own) added at its receiver's hook (its slot of a q/k/v
    fork, the MLP's own input, the final residual) of the corrupt run; NaN where no edge."""
    c, k = pairs.clean, pairs.corrupt
    tc = _terms(bridge, graph, c.tokens, c.pad_mask)
    tk = _terms(bridge, graph, k.tokens, k.pad_mask)
    worst, n = 0.0, 0
    for got in results:
        for j, r in enumerate(got.receivers):
            for i, w in enumerate(got.senders):
                if not graph.valid[graph.reader_index(r), graph.writer_index(w)]:
                    assert np.isnan(got.values[i, j])
                    continue
                d = tc[w] - tk[w]
                if parse(r).kind == "input":
                    hook, slot = _fork(r)

                    def add(t, hook, d=d, slot=slot):
                        t = t.clone()
                        t[:, :, slot] += d
                        return t
                elif r == "logits":
                    hook, add = (
                        f"blocks.{graph.n_layers - 1}.hook_resid_post",
                        lambda t, hook, d=d: t + d,
                    )
                else:
                    hook, add = (
                        f"blocks.{parse(r).layer}.{graph.mlp_in_hook}",
                        lambda t, hook, d=d: t + d,
                    )
                if parse(r).kind == "mlp":  # the MLP's own copy of its input
                    bridge.set_use_hook_mlp_in(True)
                    try:
                        logits = bridge.run_with_hooks(k.tokens, fwd_hooks=[(hook, add)], attention_mask=k.pad_mask.long())  # fmt: skip
                    finally:
                        bridge.set_use_hook_mlp_in(False)
                else:
                    logits = _run(bridge, k.tokens, k.pad_mask, [(hook, add)])
                want = float(_metric(_last(logits.detach(), k.pad_mask), c.labels, k.labels).mean())
                worst, n = max(worst, abs(got.values[i, j] - want)), n + 1
    return worst, n


def test_path_patching_into_a_key_value_head_equals_a_naive_hook_loop(grouped):
    """Each sender's clean term patched into one key/value head's k or v fork of the corrupt run
    (and into q forks, an MLP and the readout): path_patch against a naive hook loop; the head
    route names a head's k/v reader by its key/value head, and exact_edges scores every edge."""
    from probes.circuits.families import exact_edges
    from probes.circuits.route import head_route

    _, bridge, model = grouped
    graph = build_graph(model.cfg)
    pairs = _pairs(4)
    c, k = pairs.clean, pairs.corrupt
    n_kv = graph.kv_layout.n_kv_heads
    receivers = [f"L1KV{g}.{x}" for g in range(n_kv) for x in "kv"] + ["L1H2.q", "MLP0", "logits"]
    pp = {x: path_patch(model, pairs, None, None, [r for r in receivers if r.endswith(f".{x}") or (x == "q" and "." not in r)], x, metric=_metric) for x in "qkv"}  # fmt: skip
    with torch.no_grad():
        plain = _last(_run(bridge, k.tokens, k.pad_mask, []), k.pad_mask)
    corrupt = float(_metric(plain, c.labels, k.labels).mean())
    assert all(abs(got.corrupt_metric - corrupt) <= 1e-9 for got in pp.values())
    worst, n = _naive_path_patches(bridge, graph, pairs, pp.values())
    print(f"{n_kv} key/value heads: {n} path patches, max |path_patch - naive| {worst:.1e}")
    assert n >= 30 and worst <= 1e-9, worst
    k_reader = f"L1KV{graph.kv_layout.kv_head(3)}.k"
    assert pp["k"].receivers[pp["k"].receivers.index(k_reader)] == k_reader

    class Task:  # a task whose pairs cost nothing
        def counterfactuals(self, n, kind, seed):
            return pairs

    route = head_route(model, Task(), "L1H3", n=N, kinds=("position",), metric="logit_diff")
    exact = route.exact["position"]["k"]
    direct = path_patch(model, pairs, None, list(exact), [k_reader], "k", metric="logit_diff")
    assert max(abs(exact[s] - direct.effect(s, k_reader)) for s in exact) <= 1e-12
    scores = exact_edges(model, pairs, metric=_metric)
    r, w = graph.reader_index(k_reader), graph.writer_index("L0H1")
    assert abs(scores.scores[r, w] - pp["k"].effect("L0H1", k_reader)) <= 1e-9

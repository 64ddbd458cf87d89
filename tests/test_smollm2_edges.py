"""SmolLM2-135M's own edges (issue 55's acceptance): exact edge ablation on the real grouped model
(9 query heads on 3 key/value heads a layer, 30 layers) equals a naive hook loop written on the
bridge's hooks alone, for single edges into each kind of reader (a query head, a key/value head's k
and v, an MLP, the readout) and for a set of them across layers.

The naive loop records every writer's live term as its hook fires (the embedding, each head's
``z_h W_O[h]``, each MLP's output) and, at each ablated edge's reader (its slot of the q/k/v fork,
the MLP's input, the last residual), adds the corrupt run's term minus the live one. Skipped where
SmolLM2 is not installed (``make smollm2``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

SMOLLM2 = Path(__file__).resolve().parents[1] / ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SMOLLM2.is_file(), reason="make smollm2 fetches the file (93 MB)"),
]


def _margin(logits, good, bad):
    return (logits.gather(1, good[:, None]) - logits.gather(1, bad[:, None]))[:, 0].double()


def _hooks_of(model, graph, live, edits):
    """Hooks that record each writer's live term into ``live`` and apply ``edits``
    (``{hook: [(slot or None, writer)]}``) as corrupt minus live, from ``edits``' ``terms``."""
    H, n_layers = model.cfg.n_heads, model.cfg.n_layers
    W_O = [model.blocks[i].attn.W_O for i in range(n_layers)]

    def record(x, hook, name):
        if name.startswith("z"):
            layer = int(name[1:])
            for h in range(H):
                live[f"L{layer}H{h}"] = x[:, :, h] @ W_O[layer][h]
        else:
            live[name] = x
        return x

    hooks = [(graph.embed_hook, lambda x, hook: record(x, hook, "embed"))]
    for i in range(n_layers):
        hooks.append((f"blocks.{i}.attn.hook_z", lambda x, hook, i=i: record(x, hook, f"z{i}")))
        hooks.append((f"blocks.{i}.hook_mlp_out", lambda x, hook, i=i: record(x, hook, f"MLP{i}")))
    terms, by_hook = edits

    def swap(x, hook, name):
        x = x.clone()
        for slot, writer, *at in by_hook[name]:  # at: the positions ablated ([b, p]), else all
            d = terms[writer] - live[writer]
            d = d * at[0][..., None] if at else d
            if slot is None:
                x += d
            else:
                x[:, :, slot] += d
        return x

    return hooks + [(n, lambda x, hook, n=n: swap(x, hook, n)) for n in by_hook]


def _terms(model, graph, run) -> dict:
    """Every writer's term in ``run`` (``{"embed" | "L{l}H{h}" | "MLP{l}": [b, p, d]}``)."""
    live: dict = {}
    with torch.no_grad():
        model.run_with_hooks(
            run.tokens, run.pad_mask, fwd_hooks=_hooks_of(model, graph, live, ({}, {}))
        )
    return live


def _naive(model, graph, run, labels, terms, ablated, metric=None):
    """The metric of ``run`` (``metric(logits, good, bad)``, default the logit difference) with
    each ``(writer, reader)`` of ``ablated`` reading ``terms``, or ``(writer, reader, at)`` reading
    them at the positions ``at`` ([b, p], 1 where ablated) only."""
    from probes.circuits.graph import parse

    by_hook: dict[str, list] = {}
    for writer, reader, *at in ablated:
        s = parse(reader)
        if s.kind == "input":
            slot = s.head if s.kv is None else s.kv
            hook = f"blocks.{s.layer}.attn.hook_{s.component}_input"
        elif s.kind == "mlp":
            hook, slot = f"blocks.{s.layer}.{graph.mlp_in_hook}", None
        else:
            hook, slot = f"blocks.{graph.n_layers - 1}.hook_resid_post", None
        by_hook.setdefault(hook, []).append((slot, writer, *at))
    live: dict = {}
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    try:
        with torch.no_grad():
            hooks = _hooks_of(model, graph, live, (terms, by_hook))
            logits = model.run_with_hooks(run.tokens, run.pad_mask, fwd_hooks=hooks)
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)
    return (metric or _margin)(logits, *labels)


def test_smollm2_exact_edge_ablation_equals_a_naive_hook_loop():
    import pe_interp
    from probes.circuits.edge_ablation import ablated_metric
    from probes.circuits.engine import as_pair, capture, contributions, forks, writer_hooks
    from probes.circuits.graph import build_graph

    model = pe_interp.load(SMOLLM2, task="induction")
    pairs = model.origin.task.counterfactuals(3, kind="position", seed=1)
    graph = build_graph(model.cfg)
    assert graph.grouped and graph.kv_layout.n_kv_heads == 3
    c, k = as_pair(model, pairs, None)
    labels = (c.labels, k.labels)
    terms = _terms(model, graph, k)  # the corrupt run's, by the same hooks
    sets = [
        [("L16H0", "L18KV2.k")],  # the previous-token head into an induction head's keys
        [("L16H0", "L18KV2.v")],
        [("embed", "L1H4.q")],
        [("L1H4", "MLP17")],
        [("MLP29", "logits")],
        [("L16H0", "L18KV2.k"), ("L1H4", "L16H0.q"), ("MLP3", "L17KV1.k"), ("L18H6", "logits")],
    ]
    keep = np.ones((len(sets), *graph.valid.shape), dtype=bool)
    for j, edges in enumerate(sets):
        for w, r in edges:
            graph.check_edge(w, r)
            keep[j, graph.reader_index(r), graph.writer_index(w)] = False
    with forks(model), torch.no_grad():
        repl = contributions(model, graph, capture(model, k, writer_hooks(graph))[0])
        got = ablated_metric(model, graph, c, repl, torch.as_tensor(keep), _margin, *labels)
    want = torch.stack([_naive(model, graph, c, labels, terms, e) for e in sets])
    clean = _naive(model, graph, c, labels, terms, [])
    moved = (want - clean[None]).abs().amax(1)
    worst = float((got - want).abs().max())
    print(
        f"SmolLM2: max |exact - naive| {worst:.2e}; each set moves the margin by {moved.tolist()}"
    )
    assert float(moved.min()) > 1e-3  # every ablation matters
    assert worst <= 1e-4 * max(1.0, float(want.abs().max()))


def naive_faithfulness(model, circuit, pairs, task) -> float:
    """The faithfulness of a position-aware ``circuit`` on ``pairs`` by the naive loop: every
    unit not kept (an edge at a span of the examples) reads the corrupt run's term at that span's
    positions; the metric is the answer's margin (its logit minus the largest other), as
    ``pe-interp circuit``'s; recovered = (kept - corrupt) / (clean - corrupt) of the means."""
    from probes.circuits.engine import as_pair
    from probes.circuits.graph import build_graph
    from probes.common.metrics import margin

    graph = build_graph(model.cfg, circuit.kv_view)
    c, k = as_pair(model, pairs, None)
    ids = torch.as_tensor(np.asarray(task.spans(pairs.clean)))
    span_of = [circuit.span_names.index(n) for n in task.span_names]
    ids = torch.as_tensor(span_of)[ids]  # the task's span ids in the circuit's order
    keep = torch.as_tensor(circuit.keep_mask(graph))
    ablated = []
    for ri, reader in enumerate(graph.readers):
        for wi, writer in enumerate(graph.writers):
            if graph.valid[ri, wi]:
                at = (~keep[ri, wi])[ids].double()  # [b, p]: 1 where its span is not kept
                if at.any():
                    ablated.append((writer, reader, at))
    terms = _terms(model, graph, k)

    def metric(logits, good, bad):
        return margin(logits, good).double()

    run = [
        _naive(model, graph, c, (c.labels, k.labels), terms, edges, metric)
        for edges in ([], ablated)
    ]
    corrupt = _naive(model, graph, k, (c.labels, k.labels), _terms(model, graph, k), [], metric)
    clean, kept = (float(x.mean()) for x in run)
    return (kept - float(corrupt.mean())) / (clean - float(corrupt.mean()))


def test_smollm2_position_aware_circuit_faithfulness_equals_a_naive_hook_loop():
    """A position-aware circuit on SmolLM2's induction pairs (AtP-ranked on other pairs, about a
    fifth of the units): its faithfulness by the probes' exact edge ablation equals the naive
    loop's, which ablates every dropped (edge, span) at that span's positions."""
    import pe_interp
    from probes import attribute
    from probes.circuits import faithfulness_curve, rank_edges

    model = pe_interp.load(SMOLLM2, task="induction")
    task = model.origin.task
    train = task.counterfactuals(4, kind="position", seed=0)
    held = task.counterfactuals(4, kind="position", seed=1)
    scores = attribute(
        model,
        train,
        granularity="edge",
        metric="margin",
        spans=task.spans(train.clean),
        span_names=task.span_names,
    )
    ranking = rank_edges(scores, positional=True)
    circuit = ranking.circuit(ranking.total // 5)
    got = faithfulness_curve(model, circuit, held, spans=task, metric="margin")["recovered"][0]
    want = naive_faithfulness(model, circuit, held, task)
    print(f"SmolLM2 circuit of {len(circuit.edges)} units: exact {got:.6f}, naive {want:.6f}")
    assert abs(want) > 0.05 and abs(want - 1) > 0.05  # neither empty nor whole in effect
    assert abs(got - want) <= 2e-4 * max(1.0, abs(want))  # float32, a ratio of 4-pair means

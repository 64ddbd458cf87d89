"""TransformerLens' circuit tools run unchanged on HookedPETransformer and give the numbers of
naive hook loops written here.

- ``transformer_lens.patching.get_act_patch_direct_path`` (q, k, v) against a loop that never
  uses the per-head input forks: the receiver head's q/k/v (``attn.hook_q/k/v``) is recomputed
  from ``ln1(resid_pre + sender's clean-minus-corrupt z_h W_O[h])``.
- ``attribution_patch`` (node and edge granularity) against gradients taken with
  ``torch.autograd`` through zero tensors added at our hooks, on an edge list enumerated here.
- ``faithfulness`` against a forward where every reader's input is rebuilt from scratch as
  (positional term + output biases) + the sum of its writers, each the live one if the edge is in
  the circuit and the corrupt run's otherwise.

Cases: random models with rope, sinusoidal, t5 and alibi, and a distance model trained at the
smoke preset on the task's own counterfactual pairs. Where our architecture has no such edges
(``kv_source="embed"``: keys and values read the layer-0 input) the k/v tools refuse in one line.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from circuit_env import (
    CLASSES,
    LENGTHS,
    POS,
    autograd_at,
    cache_of,
    class_metric,
    flags,
    forks,
    random_model,
    random_pairs,
)
from transformer_lens import patching as tlp
from transformer_lens.tools.analysis import attribution_patching as ap

import pe_interp
from pe_interp import ModelConfig
from pe_interp.config.model import KV_EMBED_NO_EDGES
from pe_interp.config.presets import build_run_configs

RANDOM_ENCODINGS = ("rope", "sinusoidal", "t5", "alibi")
CASES = (*RANDOM_ENCODINGS, "trained-rope")
ATTN_READERS = ("q_input", "k_input", "v_input")
Key = tuple  # (kind, layer, head, position), the fields of a TransformerLens Node


@pytest.fixture(scope="module")
def trained_case():
    torch.manual_seed(0)
    result = pe_interp.train(
        task="distance", encoding="rope", preset="smoke", progress=False, epochs=20, lr=1e-2
    )
    assert result.final["test_acc"] > 0.5, result.final  # it learnt something: a circuit to find
    _, task, _ = build_run_configs("distance", "rope", "smoke", 0)
    pairs = task.counterfactual_pairs(3, seed=1)
    model = result.model.double().eval()
    metric = class_metric(int(pairs.clean.labels[0]), int(pairs.corrupt.labels[0]))
    return model, pairs.clean.tokens, pairs.corrupt.tokens, metric


@pytest.fixture(params=CASES)
def case(request):
    """(model, clean tokens, corrupt tokens, metric)."""
    if request.param == "trained-rope":
        return request.getfixturevalue("trained_case")
    clean, corrupt = random_pairs()
    return random_model(request.param), clean, corrupt, class_metric(1, 0)


def quiet(fn, *args, **kwargs):
    with contextlib.redirect_stderr(io.StringIO()):  # tqdm
        return fn(*args, **kwargs)


def writer_outputs(model, tokens) -> dict:
    """Each writer's residual contribution, computed here: the token embedding, each head's
    ``z_h W_O[h]`` ``[batch, pos, head, d_model]`` (from hook_z, not hook_result), each MLP out."""
    cache = cache_of(model, tokens)
    out = {"embed": cache["hook_embed"], "pos": cache.cache_dict.get("hook_pos_embed", 0.0)}
    for layer, block in enumerate(model.blocks):
        W_O = block.attn.W_O.detach()
        out["head", layer] = torch.einsum(
            "bphd,hdm->bphm", cache[f"blocks.{layer}.attn.hook_z"], W_O
        )
        out["mlp", layer] = cache[f"blocks.{layer}.hook_mlp_out"]
    return out


def contribution(outputs: dict, writer: Key, row: int = 0) -> torch.Tensor:
    kind, layer, head, pos = writer
    if kind == "embed":
        return outputs["embed"][row, pos]
    if kind == "attn_head_out":
        return outputs["head", layer][row, pos, head]
    return outputs["mlp", layer][row, pos]


def naive_edges(n_layers: int, n_heads: int, n_pos: int) -> list[tuple[Key, Key]]:
    """Every writer -> reader pair of the residual stream: a reader at layer l reads the embedding
    and every head and MLP before it; an MLP also reads its own layer's heads; the readout reads
    everything."""
    edges = []
    for p in range(n_pos):
        before = [("embed", None, None, p)]
        for layer in range(n_layers):
            for kind in ATTN_READERS:
                edges += [(w, (kind, layer, h, p)) for h in range(n_heads) for w in before]
            before += [("attn_head_out", layer, h, p) for h in range(n_heads)]
            edges += [(w, ("mlp_in", layer, None, p)) for w in before]
            before += [("mlp_out", layer, None, p)]
        edges += [(w, ("logits", n_layers - 1, None, p)) for w in before]
    return edges


def key(node: ap.Node) -> Key:
    return node.kind, node.layer, node.head, node.position


def tl_node(k: Key) -> ap.Node:
    kind, layer, head, pos = k
    return ap.Node(kind=kind, position=pos, layer=layer, head=head)


# ---------------------------------------------------------------------------- hooks and flags
@pytest.mark.parametrize("encoding", ["rope", "t5", "sinusoidal+rope", "decoupled_rope"])
@pytest.mark.parametrize("kv_source", ["residual", "embed"])
def test_use_flags_keep_the_function_and_have_transformer_lens_semantics(encoding, kv_source):
    model = random_model(encoding, kv_source=kv_source)
    clean, _ = random_pairs()
    with torch.no_grad():
        plain = model(clean)
    settings = [("attn_result", True), ("split_qkv_input", True), ("hook_mlp_in", True)]
    for name, value in settings:
        getattr(model, f"set_use_{name}")(value)
    cache = cache_of(model, clean)
    torch.testing.assert_close(model(clean), plain, rtol=0, atol=1e-12)
    layer0_input = cache["hook_embed"] + cache.cache_dict.get("hook_pos_embed", 0.0)
    for layer, block in enumerate(model.blocks):
        name = f"blocks.{layer}"
        result = cache[f"{name}.attn.hook_result"]
        assert result.shape == (len(LENGTHS), POS, 2, 16)
        z = cache[f"{name}.attn.hook_z"]
        for h in range(2):
            torch.testing.assert_close(
                result[:, :, h], z[:, :, h] @ block.attn.W_O[h], rtol=0, atol=1e-12
            )
        torch.testing.assert_close(
            result.sum(2) + block.attn.b_O, cache[f"{name}.hook_attn_out"], rtol=0, atol=1e-12
        )
        kv_input = cache[f"{name}.hook_resid_pre"] if kv_source == "residual" else layer0_input
        for kind, expected in (
            ("q", cache[f"{name}.hook_resid_pre"]),
            ("k", kv_input),
            ("v", kv_input),
        ):
            fork = cache[f"{name}.attn.hook_{kind}_input"]
            assert fork.shape == (len(LENGTHS), POS, 2, 16)
            for h in range(2):  # a pre-norm copy per head
                torch.testing.assert_close(fork[:, :, h], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(
            cache[f"{name}.hook_mlp_in"], cache[f"{name}.hook_resid_mid"], rtol=0, atol=0
        )
        for kind in "qkv":  # each head's copy feeds that head's projection, and only it

            def nudge(x, hook):
                x = x.clone()
                x[:, :, 0] += torch.linspace(
                    -1.0, 1.0, x.shape[-1], dtype=x.dtype
                )  # LN removes a constant
                return x

            seen = {}
            with torch.no_grad():
                model.run_with_hooks(
                    clean,
                    fwd_hooks=[
                        (f"{name}.attn.hook_{kind}_input", nudge),
                        (
                            f"{name}.attn.hook_{kind}",
                            lambda x, hook, seen=seen: seen.setdefault("x", x.clone()),
                        ),
                    ],
                )
            before = cache[f"{name}.attn.hook_{kind}"]
            assert float((seen["x"][:, :, 0] - before[:, :, 0]).abs().max()) > 1e-3, (name, kind)
            torch.testing.assert_close(seen["x"][:, :, 1], before[:, :, 1], rtol=0, atol=1e-12)
    for name, _ in settings:
        getattr(model, f"set_use_{name}")(False)
    if kv_source == "residual":
        model.set_use_attn_in(True)
        cache = cache_of(model, clean)
        torch.testing.assert_close(model(clean), plain, rtol=0, atol=1e-12)
        for layer in range(3):
            shared = cache[f"blocks.{layer}.attn.hook_attn_in"]
            torch.testing.assert_close(
                shared[:, :, 1], cache[f"blocks.{layer}.hook_resid_pre"], rtol=0, atol=1e-12
            )


# ---------------------------------------------------------------------------- direct path
def naive_direct_path(
    model, clean, corrupt, metric, src_layer, src_head, component
) -> torch.Tensor:
    """The receiver head's q/k/v recomputed from its input with the sender's write added, set at
    ``attn.hook_{component}`` (no per-head input fork involved)."""
    clean_out, corrupt_out = writer_outputs(model, clean), writer_outputs(model, corrupt)
    delta = (
        clean_out["head", src_layer][:, :, src_head]
        - corrupt_out["head", src_layer][:, :, src_head]
    )
    resid = cache_of(model, corrupt, lambda n: n.endswith("hook_resid_pre"))
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for layer in range(src_layer + 1, n_layers):
        attn = model.blocks[layer].attn
        W, b = {"q": (attn.W_Q, attn.b_Q), "k": (attn.W_K, attn.b_K), "v": (attn.W_V, attn.b_V)}[
            component
        ]
        with torch.no_grad():
            x = model.blocks[layer].ln1(resid[f"blocks.{layer}.hook_resid_pre"] + delta)
        for head in range(n_heads):
            new = x @ W[head] + b[head]

            def set_head(act, hook, head=head, new=new):
                act = act.clone()
                act[:, :, head] = new
                return act

            with torch.no_grad():
                logits = model.run_with_hooks(
                    corrupt, fwd_hooks=[(f"blocks.{layer}.attn.hook_{component}", set_head)]
                )
            out[layer, head] = metric(logits)
    return out


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_direct_path_matches_naive_loop(case, component):
    model, clean, corrupt, metric = case
    clean_cache, corrupt_cache = cache_of(model, clean), cache_of(model, corrupt)
    with torch.no_grad():
        baseline = float(metric(model(corrupt)))
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    moved = 0.0
    for src_layer in range(n_layers - 1):
        for src_head in range(n_heads):
            before = flags(model)
            tl = tlp.get_act_patch_direct_path(
                model,
                corrupt,
                clean_cache,
                corrupt_cache,
                metric,
                src_layer,
                src_head,
                component,
                verbose=False,
            )
            assert flags(model) == before
            naive = naive_direct_path(model, clean, corrupt, metric, src_layer, src_head, component)
            torch.testing.assert_close(
                tl.double(), naive, rtol=1e-5, atol=1e-5
            )  # TL stores float32
            moved = max(moved, float((naive[src_layer + 1 :] - baseline).abs().max()))
    assert moved > 1e-3  # some path moves the metric, so a wrong path would show


def test_direct_path_restores_use_attn_in():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    model.set_use_attn_in(True)
    clean_cache, corrupt_cache = cache_of(model, clean), cache_of(model, corrupt)
    quiet(
        tlp.get_act_patch_direct_path,
        model,
        corrupt,
        clean_cache,
        corrupt_cache,
        class_metric(1, 0),
        0,
        0,
        "k",
    )
    assert flags(model) == (False, False, True, False)


# ---------------------------------------------------------------------------- attribution patching
def naive_node_scores(model, clean, corrupt, metric) -> dict[Key, float]:
    """(clean - corrupt) . d metric/d activation at the corrupt point, per node, batch mean."""
    n_layers = model.cfg.n_layers
    names = ["hook_embed"]
    names += [
        f"blocks.{layer}.{hook}"
        for layer in range(n_layers)
        for hook in ("attn.hook_z", "hook_mlp_out")
    ]
    grads = autograd_at(model, corrupt, metric, names)
    a_clean, a_corrupt = (
        cache_of(model, clean, names.__contains__),
        cache_of(model, corrupt, names.__contains__),
    )
    scores = {}
    for name in names:
        per = ((a_clean[name] - a_corrupt[name]) * grads[name]).mean(0)  # [pos, (head,) feature]
        for p in range(per.shape[0]):
            if name == "hook_embed":
                scores["embed", None, None, p] = float(per[p].sum())
            elif name.endswith("hook_z"):
                layer = int(name.split(".")[1])
                for h in range(per.shape[1]):
                    scores["attn_head_out", layer, h, p] = float(per[p, h].sum())
            else:
                scores["mlp_out", int(name.split(".")[1]), None, p] = float(per[p].sum())
    return scores


def naive_edge_scores(model, clean, corrupt, metric) -> dict[tuple[Key, Key], float]:
    """(writer's clean - corrupt contribution) . d metric/d (reader's input), batch mean."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    readers = {}
    for layer in range(n_layers):
        readers.update({f"blocks.{layer}.attn.hook_{kind}": (kind, layer) for kind in ATTN_READERS})
        readers[f"blocks.{layer}.hook_mlp_in"] = ("mlp_in", layer)
    readers[f"blocks.{n_layers - 1}.hook_resid_post"] = ("logits", n_layers - 1)
    with forks(model):
        grads = autograd_at(model, corrupt, metric, list(readers))
    grad_of = {readers[n]: g for n, g in grads.items()}
    c, k = writer_outputs(model, clean), writer_outputs(model, corrupt)
    scores = {}
    for writer, reader in naive_edges(n_layers, n_heads, clean.shape[1]):
        kind, layer, head, p = reader
        g = grad_of[kind, layer][:, p] if head is None else grad_of[kind, layer][:, p, head]
        rows = range(clean.shape[0])
        delta = torch.stack([contribution(c, writer, b) - contribution(k, writer, b) for b in rows])
        scores[writer, reader] = float((delta * g).sum(-1).mean())
    return scores


def assert_scores_equal(tl: dict, naive: dict) -> None:
    assert set(tl) == set(naive)
    keys = sorted(naive, key=repr)
    a = torch.tensor([tl[k] for k in keys], dtype=torch.float64)
    b = torch.tensor([naive[k] for k in keys], dtype=torch.float64)
    torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)
    assert float(b.abs().max()) > 1e-3  # not all zero, so a wrong score would show


def test_attribution_node_matches_autograd(case):
    model, clean, corrupt, metric = case
    tl = ap.attribution_patch(model, clean, corrupt, metric)
    assert_scores_equal(
        {key(n): s for n, s in tl.node_scores.items()},
        naive_node_scores(model, clean, corrupt, metric),
    )


def test_attribution_node_on_embed_kv_matches_autograd():
    """Node scores need no edges, so they work when keys and values read the embedding."""
    model = random_model("sinusoidal", kv_source="embed")
    clean, corrupt = random_pairs()
    metric = class_metric(1, 0)
    tl = ap.attribution_patch(model, clean, corrupt, metric)
    assert_scores_equal(
        {key(n): s for n, s in tl.node_scores.items()},
        naive_node_scores(model, clean, corrupt, metric),
    )


def test_attribution_edge_matches_autograd(case):
    model, clean, corrupt, metric = case
    before = flags(model)
    tl = ap.attribution_patch(
        model, clean, corrupt, metric, ap.EdgeAttributionConfig(granularity="edge")
    )
    assert flags(model) == before
    tl_edges = {(key(w), key(r)): s for (w, r), s in tl.edge_scores.items()}
    assert_scores_equal(tl_edges, naive_edge_scores(model, clean, corrupt, metric))
    # Each writer's edges add up to its node score: the forks and the readout see all of it.
    naive_nodes = naive_node_scores(model, clean, corrupt, metric)
    assert_scores_equal({key(n): s for n, s in tl.node_scores.items()}, naive_nodes)


# ---------------------------------------------------------------------------- faithfulness
def hand_ablated_metric(model, clean, corrupt, metric, kept: set[tuple[Key, Key]]) -> float:
    """One clean forward where each reader's input is rebuilt from scratch: positional term +
    the output biases before it + each writer, live if the edge is kept, corrupt's otherwise."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    n_pos = clean.shape[1]
    corrupt_out = writer_outputs(model, corrupt)
    pos_term = writer_outputs(model, clean)["pos"]
    b_O = [block.attn.b_O.detach() for block in model.blocks]
    by_reader: dict[Key, list[Key]] = {}
    for writer, reader in naive_edges(n_layers, n_heads, n_pos):
        by_reader.setdefault(reader, []).append(writer)
    live: dict = {}

    def capture(slot, per_head_W_O=None):
        def hook(x, hook):
            live[slot] = (
                torch.einsum("bphd,hdm->bphm", x, per_head_W_O) if per_head_W_O is not None else x
            )

        return hook

    def rebuild(kind, layer, n_biases):
        def hook(x, hook):
            x = x.clone()
            for p in range(n_pos):
                base = (pos_term[0, p] if torch.is_tensor(pos_term) else 0.0) + sum(b_O[:n_biases])
                for head in range(n_heads) if kind in ATTN_READERS else [None]:
                    reader = (kind, layer, head, p)
                    total = base + sum(
                        contribution(live if (w, reader) in kept else corrupt_out, w)
                        for w in by_reader[reader]
                    )
                    if head is None:
                        x[0, p] = total
                    else:
                        x[0, p, head] = total
            return x

        return hook

    hooks = [("hook_embed", capture("embed"))]
    for layer, block in enumerate(model.blocks):
        name = f"blocks.{layer}"
        hooks += [
            (f"{name}.attn.hook_{kind}", rebuild(kind, layer, layer)) for kind in ATTN_READERS
        ]
        hooks += [(f"{name}.attn.hook_z", capture(("head", layer), block.attn.W_O))]
        hooks += [(f"{name}.hook_mlp_in", rebuild("mlp_in", layer, layer + 1))]
        hooks += [(f"{name}.hook_mlp_out", capture(("mlp", layer)))]
    hooks += [(f"blocks.{n_layers - 1}.hook_resid_post", rebuild("logits", n_layers - 1, n_layers))]
    with torch.no_grad(), forks(model):
        return float(metric(model.run_with_hooks(clean, fwd_hooks=hooks)))


def edge_class(reader: Key) -> str:
    return {
        "q_input": "into_qk",
        "k_input": "into_qk",
        "v_input": "into_v",
        "mlp_in": "into_mlp",
    }.get(reader[0], "into_logits")


def test_faithfulness_matches_hand_ablation(case):
    model, clean, corrupt, metric = case
    clean, corrupt = clean[1:2], corrupt[1:2]  # one pair; a padded one in the random cases
    edges = naive_edges(model.cfg.n_layers, model.cfg.n_heads, clean.shape[1])
    with torch.no_grad():
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    ranked = ap.attribution_patch(
        model, clean, corrupt, metric, ap.EdgeAttributionConfig(granularity="edge")
    )
    g = torch.Generator().manual_seed(0)
    circuits = {
        "empty": [],
        "all": edges,
        "top": [(key(w), key(r)) for w, r, _ in ranked.top_edges(k=15)],
        "random half": [
            e for e, keep in zip(edges, torch.rand(len(edges), generator=g) < 0.5) if keep
        ],
        "no qk": [e for e in edges if edge_class(e[1]) != "into_qk"],
    }
    for label, circuit in circuits.items():
        before = flags(model)
        tl = ap.faithfulness(
            model, clean, corrupt, metric, [(tl_node(w), tl_node(r)) for w, r in circuit]
        )
        assert flags(model) == before

        def recovered(kept):
            return (hand_ablated_metric(model, clean, corrupt, metric, kept) - m_corrupt) / (
                m_clean - m_corrupt
            )

        kept = set(circuit)
        assert tl.total_edges == len(edges) and tl.circuit_size == len(kept), label
        assert tl.full_metric == pytest.approx(m_clean, rel=1e-9, abs=1e-12)
        assert tl.corrupt_metric == pytest.approx(m_corrupt, rel=1e-9, abs=1e-12)
        assert tl.recovered == pytest.approx(recovered(kept), rel=1e-7, abs=1e-9), label
        for cls, value in tl.edge_class_recovered.items():
            without = {e for e in kept if edge_class(e[1]) != cls}
            assert value == pytest.approx(recovered(without), rel=1e-7, abs=1e-9), (label, cls)
        if label in ("empty", "all"):
            assert tl.recovered == pytest.approx(0.0 if label == "empty" else 1.0, abs=1e-9)
    assert abs(m_clean - m_corrupt) > 1e-3


# ---------------------------------------------------------------------------- what differs from an LM
def test_pooled_readout_is_read_per_position():
    """Our logits are ``[batch, n_classes]`` after pooling the real tokens; TL's tools only hand
    them to the metric, and read the readout per position at the last ``hook_resid_post``, so a
    pad position (not pooled) feeds the readout nothing and, with ``pooling="first"``, only
    position 0 does."""
    clean, corrupt = random_pairs()
    clean, corrupt = clean[1:2], corrupt[1:2]  # 6 real tokens, 2 pads
    for pooling, feeds in (("mean", range(LENGTHS[1])), ("first", [0])):
        model = random_model("rope", pooling=pooling)
        shapes: set[tuple[int, ...]] = set()

        def metric(logits, shapes=shapes):
            shapes.add(tuple(logits.shape))
            return (logits[:, 1] - logits[:, 0]).sum()

        res = ap.attribution_patch(
            model, clean, corrupt, metric, ap.EdgeAttributionConfig(granularity="edge")
        )
        into_readout = {}
        for (_, r), s in res.edge_scores.items():
            if r.kind == "logits":
                into_readout[r.position] = max(into_readout.get(r.position, 0.0), abs(s))
        assert {p for p, s in into_readout.items() if s != 0.0} == set(feeds), pooling
        ap.faithfulness(model, clean, corrupt, metric, res.top_edges(k=5))
        clean_cache, corrupt_cache = cache_of(model, clean), cache_of(model, corrupt)
        quiet(
            tlp.get_act_patch_direct_path,
            model,
            corrupt,
            clean_cache,
            corrupt_cache,
            metric,
            0,
            0,
            "q",
        )
        assert shapes == {(1, CLASSES)}


def test_embed_kv_refuses_k_v_edges_in_one_line():
    model = random_model("sinusoidal", kv_source="embed")
    clean, corrupt = random_pairs()
    metric = class_metric(1, 0)
    clean_cache, corrupt_cache = cache_of(model, clean), cache_of(model, corrupt)
    assert "\n" not in KV_EMBED_NO_EDGES
    calls = {
        "direct path k": lambda: tlp.get_act_patch_direct_path(model, corrupt, clean_cache, corrupt_cache, metric, 0, 0, "k"),
        "direct path v": lambda: tlp.get_act_patch_direct_path(model, corrupt, clean_cache, corrupt_cache, metric, 1, 1, "v"),
        "all sources k": lambda: tlp.get_act_patch_direct_path_all_sources(model, corrupt, clean_cache, corrupt_cache, metric, "k"),
        "edge attribution": lambda: ap.attribution_patch(model, clean, corrupt, metric, ap.EdgeAttributionConfig(granularity="edge")),
        "faithfulness": lambda: ap.faithfulness(model, clean[:1], corrupt[:1], metric, []),
    }  # fmt: skip
    for label, call in calls.items():
        with pytest.raises(ValueError) as err:
            quiet(call)
        assert str(err.value) == KV_EMBED_NO_EDGES, label
        assert flags(model) == (False, False, False, False), label
    # Queries still read the residual stream: q direct paths run and match the naive loop.
    for src_head in range(2):
        tl = quiet(
            tlp.get_act_patch_direct_path,
            model,
            corrupt,
            clean_cache,
            corrupt_cache,
            metric,
            0,
            src_head,
            "q",
        )
        naive = naive_direct_path(model, clean, corrupt, metric, 0, src_head, "q")
        torch.testing.assert_close(tl.double(), naive, rtol=1e-5, atol=1e-5)


def test_without_the_refusal_embed_kv_would_get_paths_that_do_not_exist(monkeypatch):
    """Why the refusal: with it bypassed, TL adds a head's write to a k input that no head writes
    into and reports an effect, where the true one (nothing reaches that input) is none; and the
    edge sweep scores head -> k edges that are not in the model."""
    model = random_model("sinusoidal", kv_source="embed")
    clean, corrupt = random_pairs()
    metric = class_metric(1, 0)
    monkeypatch.setattr(ModelConfig, "per_layer_num_key_value_heads", property(lambda self: None))
    clean_cache, corrupt_cache = cache_of(model, clean), cache_of(model, corrupt)
    with torch.no_grad():
        baseline = float(metric(model(corrupt)))
    tl = quiet(
        tlp.get_act_patch_direct_path, model, corrupt, clean_cache, corrupt_cache, metric, 0, 0, "k"
    )
    assert float((tl[1:] - baseline).abs().max()) > 1e-3
    res = ap.attribution_patch(
        model, clean, corrupt, metric, ap.EdgeAttributionConfig(granularity="edge")
    )
    phantom = [
        s
        for (w, r), s in res.edge_scores.items()
        if w.kind != "embed" and r.kind in ("k_input", "v_input")
    ]
    assert max(abs(s) for s in phantom) > 1e-3

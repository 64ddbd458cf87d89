"""Edges where a norm follows the attention and the MLP (issue 55, item 2): Gemma 2 and 3, OLMo 2,
tiny and random, built from their configs, saved and booted as bridges (one of them multi-query,
one key/value head).

A head's edge is defined as it acts: the receiver's input with the sender's term replaced inside
the norm's sum and the norm recomputed (:mod:`probes.circuits.post_norm`). References written here
on the Hugging Face model alone: :func:`_naive` runs it with hooks on its own modules, a head's
term replaced in the ``o_proj`` input, ``o_proj`` and ``post_attention_layernorm`` run again, and
the result fed to one receiver (a head's slice of ``q_proj``/``k_proj``/``v_proj`` computed again
from its input, the MLP's entry, the final norm's input). Exact edge ablation, faithfulness and
path patching equal it; edge attribution equals the derivative of the exact ablation (autograd
through the model's own norm, and central finite differences): the Jacobian linearisation,
recorded in ``meta["post_norm"]``."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import torch
import transformers
from test_held_back_families import ANSWERS, COMMON, FAMILIES, TOK, _pairs

from pe_interp.cli import main
from pe_interp.models.bridge.forward import check_edges
from pe_interp.models.bridge.hf_arch import boot_bridge, save_model_dir
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.models.protocol import PostNorm
from pe_interp.tasks.batch import Batch, CounterfactualPairs
from probes import attribute, path_patch
from probes.circuits.circuit_record import circuit_from_mask
from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.engine import as_pair, capture, contributions, pair_labels, writer_hooks
from probes.circuits.evaluator import EdgeEvaluator
from probes.circuits.faithfulness import faithfulness_curve
from probes.circuits.graph import build_graph, parse
from probes.circuits.runs import resolve

# family -> key/value heads (of 4 query heads): grouped, multi-query, one per head
KV = {"gemma2": 2, "gemma3": 1, "olmo2": 4}


def _build(family: str, root, **more):
    """:func:`sharpened`, saved with the word-level tokenizer: ``(hf, its directory)``."""
    hf = sharpened(family, **more)
    return hf, save_model_dir(hf, TOK, root)


def sharpened(family: str, **more):
    """The family's tiny model (its config's settings overridden by ``more``), its query and key
    projections and readout sharpened (as the held-back families) and its norms after attention
    and MLP given scales far from one."""
    cls, own = FAMILIES[family]
    config = getattr(transformers, cls)(
        **{**COMMON, "num_key_value_heads": KV[family], **own, **more}
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
            elif name.endswith(
                ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")
            ):
                p.add_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("lm_head.weight") or (
                name.endswith("embed_tokens.weight") and hf.config.tie_word_embeddings
            ):
                p.mul_(40.0)
    return hf


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict[str, tuple] = {}

    def get(family: str):
        if family not in cache:
            hf, out = _build(family, tmp_path_factory.mktemp(family) / "model")
            cache[family] = (hf, BridgedModel(boot_bridge(out), answers=ANSWERS))
        return cache[family]

    return get


def _counterfactuals(n: int = 6) -> CounterfactualPairs:
    clean, corrupt, good, bad = _pairs(n)
    mask = torch.ones_like(clean, dtype=torch.bool)
    return CounterfactualPairs(Batch(clean, good, mask), Batch(corrupt, bad, mask))


# ------------------------------------------------------------------------- the naive reference
def _naive(hf, graph, base, other, cut, good, bad, joint: bool = True, ref=None) -> np.ndarray:
    """The answer logit difference per row of the Hugging Face model run on ``base`` where reader
    ``r`` reads writer ``w``'s term from the run on ``other`` for each ``(w, r)`` in ``cut``,
    everything else as it is in this run. ``joint`` False: each cut head's norm recomputed on its
    own and the changes summed (the additive rule the norm breaks). ``ref``: the recorded terms
    to read instead of the run on ``other``'s (:func:`_record`'s keys)."""
    logits = naive_logits(hf, graph, base, other, cut, joint, ref)[:, ANSWERS]
    return (logits.gather(1, good[:, None]) - logits.gather(1, bad[:, None]))[:, 0].double().numpy()


def naive_logits(hf, graph, base, other, cut, joint: bool = True, ref=None) -> torch.Tensor:
    """:func:`_naive`'s run, its logits at the last position ``[rows, vocab]``. An entry of
    ``cut`` may be ``(w, r, where)``: the edge cut at the positions where the bool ``where``
    ``[rows, pos]`` holds only (a position-aware edge; each position's norm sees the heads cut
    there together), everywhere else as it is."""
    layers = hf.model.layers
    dh = getattr(hf.config, "head_dim", None)
    dh = dh or hf.config.hidden_size // hf.config.num_attention_heads
    into = defaultdict(list)
    for w, r, *where in cut:
        into[r].append((w, where[0][..., None] if where else torch.tensor(True)))
    ref = _record(hf, other) if ref is None else ref
    live: dict = {}

    def delta(r: str) -> torch.Tensor:
        d = torch.zeros_like(live["x", 0])
        heads = defaultdict(list)
        for w, at in into[r]:
            s = parse(w)
            if s.kind == "embed":
                d = d + torch.where(at, ref["x", 0] - live["x", 0], 0.0)
            elif s.kind == "mlp":
                norm = layers[s.layer].post_feedforward_layernorm
                d = d + torch.where(at, norm(ref["m", s.layer]) - norm(live["m", s.layer]), 0.0)
            else:
                heads[s.layer].append((s.head, at))
        for layer, hs in heads.items():
            attn, norm = layers[layer].self_attn, layers[layer].post_attention_layernorm
            z = live["z", layer]
            for group in [hs] if joint else [[h] for h in hs]:
                z_cut = z.clone()
                for h, at in group:
                    part = slice(h * dh, (h + 1) * dh)
                    z_cut[..., part] = torch.where(at, ref["z", layer][..., part], z_cut[..., part])
                d = d + norm(attn.o_proj(z_cut)) - norm(attn.o_proj(z))
        return d

    def proj(layer: int, c: str):
        def hook(module, args, out):
            out = out.clone()
            pre = getattr(layers[layer], "input_layernorm", None) or (lambda x: x)
            for slot, r in enumerate(graph.fork_readers(layer, c)):
                if into[r]:
                    x = pre(live["x", layer] + delta(r))
                    again = torch.nn.functional.linear(x, module.weight, module.bias)
                    out[..., slot * dh : (slot + 1) * dh] = again[..., slot * dh : (slot + 1) * dh]
            return out

        return hook

    handles = _recording(hf, live)
    for layer, block in enumerate(layers):
        attn = block.self_attn
        for c in "qkv":
            handles.append(getattr(attn, f"{c}_proj").register_forward_hook(proj(layer, c)))
        entry = getattr(block, "pre_feedforward_layernorm", None) or block.mlp
        handles.append(
            entry.register_forward_pre_hook(lambda m, a, r=f"MLP{layer}": (a[0] + delta(r),))
        )
    handles.append(hf.model.norm.register_forward_pre_hook(lambda m, a: (a[0] + delta("logits"),)))
    try:
        with torch.no_grad():
            return hf(base).logits[:, -1]
    finally:
        for h in handles:
            h.remove()


def _recording(hf, store: dict) -> list:
    """Hooks that keep each layer's input ``("x", l)``, its ``o_proj`` input ``("z", l)`` (the
    heads' outputs side by side) and its MLP's output before the norm ``("m", l)``."""
    handles = []
    for layer, block in enumerate(hf.model.layers):

        def layer_in(m, args, kwargs, layer=layer):
            store["x", layer] = args[0] if args else kwargs["hidden_states"]

        handles.append(block.register_forward_pre_hook(layer_in, with_kwargs=True))
        handles.append(
            block.self_attn.o_proj.register_forward_pre_hook(
                lambda m, a, layer=layer: store.__setitem__(("z", layer), a[0])
            )
        )
        handles.append(
            block.mlp.register_forward_hook(
                lambda m, a, out, layer=layer: store.__setitem__(("m", layer), out)
            )
        )
    return handles


def _record(hf, tokens) -> dict:
    store: dict = {}
    handles = _recording(hf, store)
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        for h in handles:
            h.remove()
    return store


def _cut(graph, keep: np.ndarray) -> list[tuple[str, str]]:
    """The edges a keep mask ``[readers, writers]`` ablates."""
    r, w = np.nonzero(graph.valid & ~keep)
    return [(graph.writers[j], graph.readers[i]) for i, j in zip(r, w)]


def _single_edges(graph) -> list[tuple[str, str]]:
    return [
        ("L0H1", "L1H2.q"),
        ("L0H3", graph.reader_of(1, 2, "k")),
        ("MLP0", graph.reader_of(1, 0, "v")),
        ("embed", "L1H3.q"),
        ("embed", "MLP1"),
        ("L1H0", "MLP1"),
        ("L1H1", "logits"),
        ("MLP1", "logits"),
    ]


# ------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("family", list(KV))
def test_exact_edge_ablation_and_faithfulness_equal_a_naive_loop_on_the_hf_model(built, family):
    hf, model = built(family)
    assert check_edges(model.bridge, 30) is None  # a norm after attention is no reason to refuse
    graph = build_graph(model.cfg)
    assert model.cfg.n_kv_heads == KV[family] and len(graph.fork_readers(1, "k")) == KV[family]
    pairs = _counterfactuals()
    good, bad = pairs.clean.labels, pairs.corrupt.labels
    keeps = []
    for edge in _single_edges(graph):
        keep = graph.valid.copy()
        keep[graph.reader_index(edge[1]), graph.writer_index(edge[0])] = False
        keeps.append(keep)
    rng = np.random.default_rng(0)
    keeps.append(graph.valid & (rng.random(graph.valid.shape) < 0.5))  # many edges, many layers
    keeps += [graph.valid.copy(), np.zeros_like(graph.valid)]  # the clean run, the corrupt one
    ev = EdgeEvaluator(
        model,
        pairs,
        None,
        ablation="corrupt",
        metric="logit_diff",
        reference=None,
        seed=0,
        batch_size=None,
        spans=None,
        n_spans=1,
    )
    ours = ev(np.stack(keeps)[..., None])
    want = np.stack(
        [
            _naive(hf, graph, pairs.clean.tokens, pairs.corrupt.tokens, _cut(graph, k), good, bad)
            for k in keeps
        ]
    )
    err = np.abs(ours - want).max()
    print(f"{family}: exact edge ablation vs naive loop, max |diff| {err:.2e}")
    assert err < 2e-5, err
    assert (np.abs(want[:-2] - want[-2]).max(1) > 1e-3).all()  # each cut moves the answer
    # the norm sees the cut heads together: recomputed per head and summed, it is another number
    apart = _naive(
        hf,
        graph,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        _cut(graph, keeps[-3]),
        good,
        bad,
        False,
    )
    print(f"{family}: norm per head vs joint, max |diff| {np.abs(apart - want[-3]).max():.2e}")
    assert np.abs(apart - want[-3]).max() > 5e-4
    # a reported faithfulness: the many-edge circuit's, and the curve's ends
    circuit = circuit_from_mask(graph, keeps[-3][..., None], ())
    out = faithfulness_curve(model, circuit, pairs, metric="logit_diff", ablation="corrupt")
    np.testing.assert_allclose(out["metric"][0], want[-3].mean(), atol=5e-5, rtol=0)
    np.testing.assert_allclose([out["full"], out["empty"]], want[-2:].mean(1), atol=5e-5, rtol=0)


@pytest.mark.parametrize("family", list(KV))
@pytest.mark.parametrize("ablation", ["mean", "resample"])
def test_mean_and_resample_edge_ablation_recompute_the_norm_as_the_naive_loop(
    built, family, ablation
):
    """The other replacements under the norm: each ablated writer's term inside the norm is its
    mean per position over the clean rows, or another clean row's (the seeded derangement), and
    the norm is recomputed on the sum, as the naive loop does on the Hugging Face layers."""
    from probes.common.metrics import resample_sources

    hf, model = built(family)
    graph = build_graph(model.cfg)
    pairs = _counterfactuals()
    clean, good, bad = pairs.clean.tokens, pairs.clean.labels, pairs.corrupt.labels
    rec = _record(hf, clean)
    if ablation == "mean":
        ref = {key: v.mean(0, keepdim=True).expand_as(v) for key, v in rec.items()}
    else:
        src = resample_sources(len(clean), None, 0)
        assert not bool((src == torch.arange(len(clean))).any())  # every row reads another's
        ref = {key: v[src] for key, v in rec.items()}
    rng = np.random.default_rng(1)
    keeps = [graph.valid & (rng.random(graph.valid.shape) < 0.5), np.zeros_like(graph.valid)]
    for edge in _single_edges(graph)[:3]:
        keep = graph.valid.copy()
        keep[graph.reader_index(edge[1]), graph.writer_index(edge[0])] = False
        keeps.append(keep)
    ev = EdgeEvaluator(
        model, pairs, None, ablation=ablation, metric="logit_diff", reference=None, seed=0,
        batch_size=None, spans=None, n_spans=1,
    )  # fmt: skip
    ours = ev(np.stack(keeps)[..., None])
    want = np.stack(
        [_naive(hf, graph, clean, None, _cut(graph, k), good, bad, ref=ref) for k in keeps]
    )
    full = _naive(hf, graph, clean, None, [], good, bad, ref=ref)
    err = np.abs(ours - want).max()
    print(f"{family}, {ablation}: exact edge ablation vs naive loop, max |diff| {err:.2e}")
    assert err < 2e-5, err
    assert np.abs(want[:2] - full).max() > 1e-3  # the replacement moves the answer


@pytest.mark.parametrize("family", list(KV))
def test_path_patching_equals_the_naive_loop_on_the_corrupt_run(built, family):
    """Patching an edge is ablating it in the corrupt run, with the clean run's term."""
    hf, model = built(family)
    graph = build_graph(model.cfg)
    pairs = _counterfactuals()
    good, bad = pairs.clean.labels, pairs.corrupt.labels
    senders = ["embed", "L0H1", "MLP0", "L1H2"]
    receivers = ["L1H0", graph.reader_of(1, 3, "k"), "MLP1", "logits"]
    pp = path_patch(model, pairs, None, senders, receivers, "q")
    assert pp.meta["post_norm"] == "exact"
    for i, s in enumerate(senders):
        for j, r in enumerate(pp.receivers):
            if not graph.valid[graph.reader_index(r), graph.writer_index(s)]:
                assert np.isnan(pp.values[i, j])
                continue
            want = _naive(
                hf, graph, pairs.corrupt.tokens, pairs.clean.tokens, [(s, r)], good, bad
            ).mean()
            assert abs(pp.values[i, j] - want) < 5e-5, (s, r, pp.values[i, j], want)


def _exact_derivative(model, pairs, eps: float):
    """The mean metric's derivative in each edge's keep weight at 1 (nothing ablated, the corrupt
    run's term at 0): by autograd through the exact edge ablation, and by central differences for
    the first edges of :func:`_single_edges`."""
    graph = build_graph(model.cfg)
    c, k = as_pair(model, pairs, None, "test")
    good, bad = pair_labels(c, k)
    _, fn = resolve("logit_diff")
    with torch.no_grad():
        repl = contributions(model, graph, capture(model, k, writer_hooks(graph))[0])
    keep = torch.ones(1, *graph.valid.shape, requires_grad=True)
    ablated_metric(model, graph, c, repl, keep, fn, good, bad).mean().backward()
    edges = _single_edges(graph)[:4]
    steps = torch.ones(2 * len(edges), *graph.valid.shape)
    for i, (w, r) in enumerate(edges):
        steps[2 * i, graph.reader_index(r), graph.writer_index(w)] += eps
        steps[2 * i + 1, graph.reader_index(r), graph.writer_index(w)] -= eps
    with torch.no_grad():
        m = ablated_metric(model, graph, c, repl, steps, fn, good, bad).mean(1).view(-1, 2)
    return keep.grad[0].numpy(), edges, ((m[:, 0] - m[:, 1]) / (2 * eps)).numpy()


@pytest.mark.parametrize("family", list(KV))
def test_edge_attribution_is_the_derivative_of_the_exact_ablation_through_the_norm(built, family):
    _, model = built(family)
    graph = build_graph(model.cfg)
    pairs = _counterfactuals()
    atp = attribute(model, pairs, granularity="edge", direction="noise", metric="logit_diff")
    assert atp.meta["post_norm"] == "jacobian"
    grad, edges, fd = _exact_derivative(model, pairs, 1e-2)
    scale = np.abs(grad[graph.valid]).max()
    assert scale > 1e-2
    np.testing.assert_allclose(atp.scores[graph.valid], grad[graph.valid], atol=1e-5 * scale)
    at = [(graph.reader_index(r), graph.writer_index(w)) for w, r in edges]
    print(
        f"{family}: atp, {graph.valid.sum()} edges, max |score - d/dkeep| "
        f"{np.abs(atp.scores - grad)[graph.valid].max():.1e}, max |score - finite difference| "
        f"{np.abs(np.array([atp.scores[i, j] for i, j in at]) - fd).max():.1e}, max |score| {scale:.1e}"
    )
    np.testing.assert_allclose([atp.scores[i, j] for i, j in at], fd, atol=2e-3 * scale)
    # EAP-IG's Jacobian moves along its path, step by step: one step is AtP at the clean run, and
    # with more, a writer's edges still add up to its node score (the chain rule through the norm)
    one = attribute(model, pairs, granularity="edge", method="eap-ig", steps=1, metric="logit_diff")
    np.testing.assert_allclose(one.scores[graph.valid], grad[graph.valid], atol=1e-5 * scale)
    for method, kw in (("eap-ig", {"steps": 3}), ("atp", {})):
        edges_ = attribute(model, pairs, granularity="edge", method=method, **kw)
        nodes = attribute(model, pairs, method=method, **kw)
        np.testing.assert_allclose(np.nansum(edges_.scores, axis=0), nodes.scores, atol=1e-5)
        assert "post_norm" not in nodes.meta


def test_a_norm_the_bridge_does_not_expose_is_refused_in_one_line(built, monkeypatch):
    """Where the probes cannot find the norm after the attention (an adapter that maps no
    ``ln1_post``), the attention output is not the heads' sum: one line names what is lacking."""
    import pe_interp.models.bridge.forward as forward

    _, model = built("gemma3")
    real = forward.post_norm_of
    monkeypatch.setattr(
        forward,
        "post_norm_of",
        lambda b, i, branch: None if branch == "attn" else real(b, i, branch),
    )
    why = check_edges(model.bridge, 30)
    assert why.startswith("layer 0's attention output is not the sum of its heads' z_h W_O[h]")
    assert "\n" not in why
    twice = PostNorm("", lambda x: 2 * x)
    monkeypatch.setattr(forward, "post_norm_of", lambda b, i, branch: twice)
    assert check_edges(model.bridge, 30) == (
        "layer 0's attention output is not its post-attention norm of the sum of its heads' "
        "z_h W_O[h], so a head's term inside that norm is not its own"
    )


def test_the_circuit_command_runs_on_a_config_built_gemma_3(tmp_path):
    """``pe-interp circuit MODEL --task induction --whole-edges`` on a Gemma 3 directory with one
    key/value head: its circuit and its faithfulness, the linearisation recorded."""
    # a window the prompts fit in (a shorter one is refused in one line)
    _, out_dir = _build("gemma3", tmp_path / "model", max_position_embeddings=96, sliding_window=32)
    out = tmp_path / "circuit"
    argv = ["circuit", str(out_dir), "--task", "induction", "--n", "6", "--whole-edges"]
    assert main([*argv, "--top-n", "8", "--out", str(out)]) == 0
    saved = json.loads((out / "circuit.json").read_text())
    assert 0 < len(saved["edges"]) <= 8 and saved["meta"]["post_norm"] == "jacobian"
    assert not any(r.endswith((".k", ".v")) and "KV0" not in r for _, r in saved["edges"])
    assert np.isfinite(saved["faithfulness"]["kept"])

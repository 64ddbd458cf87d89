"""Attribution, path patching and circuits on a TransformerLens 4 bridge (issue 38): the four
architectures built from configs, each probe held to a reference written here, on the Hugging Face
modules themselves or as a naive loop over the bridge's own hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_interp.models.bridge.hf_arch import (
    ARCHS,
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.tasks.batch import Batch, CounterfactualPairs
from probes import attribute, path_patch
from probes.circuits.engine import as_pair, capture, contributions, forks, writer_hooks
from probes.circuits.faithfulness import ablated_metric
from probes.circuits.graph import build_graph

V, PAD = 30, 0
ANSWERS = [26, 27, 28, 29]
SHAPE = {
    "n_layers": 2,
    "d_model": 24,
    "n_heads": 3,
    "d_mlp": 40,
    "n_ctx": 16,
    "d_vocab": V,
    "pad_id": PAD,
}
# the Hugging Face modules that normalise a block's attention input and its MLP input
NORMS = {
    "gpt2": ("transformer.h", "ln_1", "ln_2"),
    "gpt-neox": ("gpt_neox.layers", "input_layernorm", "post_attention_layernorm"),
    "llama": ("model.layers", "input_layernorm", "post_attention_layernorm"),
    "bloom": ("transformer.h", "input_layernorm", "post_attention_layernorm"),
}


@pytest.fixture(scope="module", params=ARCHS)
def bridged(request, tmp_path_factory):
    arch = request.param
    hf = build_hf_model(arch, seed=7, **SHAPE)
    out = save_model_dir(hf, word_tokenizer(V, PAD), tmp_path_factory.mktemp(arch) / "model")
    bridge = boot_bridge(out)
    return arch, bridge, BridgedModel(bridge, answers=ANSWERS)


def _pairs(n: int = 12, seed: int = 0) -> CounterfactualPairs:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 11, (n,), generator=g)
    mask = torch.arange(10)[None] < lengths[:, None]
    clean, corrupt = (
        torch.randint(1, 26, (n, 10), generator=g),
        torch.randint(1, 26, (n, 10), generator=g),
    )
    clean[~mask], corrupt[~mask] = PAD, PAD
    good = torch.randint(0, 4, (n,), generator=g)
    return CounterfactualPairs(Batch(clean, good, mask), Batch(corrupt, (good + 1) % 4, mask))


def _last(logits, mask):
    return logits[torch.arange(len(mask)), mask.sum(1) - 1][:, ANSWERS]


def _hf_module(bridge, arch: str, layer: int, which: int):
    path, *norms = NORMS[arch]
    mod = bridge.original_model
    for part in path.split("."):
        mod = getattr(mod, part)
    return getattr(mod[layer], norms[which])


@pytest.mark.parametrize("which", [0, 1], ids=["attention-forks", "mlp-input"])
def test_the_reader_hooks_add_to_the_input_the_hugging_face_block_normalises(bridged, which):
    """A delta at every head's q, k and v fork (or at the MLP's input hook) of layer 1 is a delta
    on the input of the Hugging Face norm that feeds attention (or the MLP), and on nothing else."""
    arch, bridge, model = bridged
    pairs = _pairs()
    tokens, mask = pairs.clean.tokens, pairs.clean.pad_mask
    d = torch.randn(*tokens.shape, SHAPE["d_model"], generator=torch.Generator().manual_seed(1))
    after_norm = (
        arch == "bloom" and which == 0
    )  # TransformerLens #1317: BLOOM's forks follow the norm
    norm = _hf_module(bridge, arch, 1, which)
    handle = (
        norm.register_forward_hook(lambda m, args, out: out + d)
        if after_norm
        else norm.register_forward_pre_hook(lambda m, args: (args[0] + d,))
    )
    try:
        with torch.no_grad():
            want = _last(bridge.original_model(tokens, attention_mask=mask.long()).logits, mask)
    finally:
        handle.remove()
    graph = build_graph(model.cfg)
    names = (
        [f"blocks.1.attn.hook_{c}_input" for c in "qkv"]
        if which == 0
        else [f"blocks.1.{graph.mlp_in_hook}"]
    )
    add = (lambda x, hook: x + d[:, :, None]) if which == 0 else (lambda x, hook: x + d)
    if after_norm:
        pattern = r"bloom: alibi: the bridge forks each head's q/k/v input after the layer norm"
        with pytest.raises(ValueError, match=pattern), forks(model):
            pass
        model.set_use_split_qkv_input(True)
    try:
        with (
            forks(model, on=which == 0 and not after_norm),
            torch.no_grad(),
            model.hooks(fwd_hooks=[(n, add) for n in names]),
        ):
            got = model.forward_unchecked(tokens, mask)
    finally:
        model.set_use_split_qkv_input(False)
    with torch.no_grad():
        clean = model(tokens, mask)
    assert float((got - clean).abs().max()) > 1e-3  # the delta matters
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def _naive_head_atp(bridge, pairs):
    """Denoising AtP of every head against a plain autograd loop: (z_clean - z_corrupt) . dm/dz at
    the corrupt run, m the clean answer's log-probability at the last real token."""
    mask = pairs.clean.pad_mask
    with torch.no_grad():
        _, cache = bridge.run_with_cache(pairs.clean.tokens, attention_mask=mask.long())
    zc = [cache[f"blocks.{layer}.attn.hook_z"] for layer in range(2)]
    with torch.no_grad():
        _, corrupt = bridge.run_with_cache(pairs.corrupt.tokens, attention_mask=mask.long())
    zk = [corrupt[f"blocks.{layer}.attn.hook_z"] for layer in range(2)]
    held = {}

    def keep(z, hook, layer):  # dm/dz through a zero added at z (the graph stays whole)
        held[layer] = torch.zeros_like(z, requires_grad=True)
        return z + held[layer]

    hooks = [
        (f"blocks.{layer}.attn.hook_z", lambda z, hook, layer=layer: keep(z, hook, layer))
        for layer in range(2)
    ]
    logits = bridge.run_with_hooks(
        pairs.corrupt.tokens, fwd_hooks=hooks, attention_mask=mask.long()
    )
    m = _last(logits, mask).log_softmax(-1).gather(1, pairs.clean.labels[:, None]).sum()
    grads = torch.autograd.grad(m, [held[0], held[1]])
    return np.array(
        [((zc[i] - zk[i]) * grads[i]).sum((0, 1, 3)).numpy() / len(mask) for i in range(2)]
    )


def test_node_attribution_on_a_bridge_equals_a_naive_autograd_loop_and_the_sum_of_its_edges(
    bridged,
):
    _, bridge, model = bridged
    pairs = _pairs()
    nodes = attribute(model, pairs)
    heads = np.array(
        [
            [nodes.scores[nodes.writers.index(f"L{layer}H{h}")] for h in range(3)]
            for layer in range(2)
        ]
    )
    np.testing.assert_allclose(heads, _naive_head_atp(bridge, pairs), atol=1e-5)
    if _refuses_edges(model, lambda: attribute(model, pairs, granularity="edge")):
        return
    # a writer's gradient is the sum of its readers' (the chain rule through every fork): read at
    # other hooks, by other code, the edges of each writer add up to its node score
    edges = attribute(model, pairs, granularity="edge")
    np.testing.assert_allclose(np.nansum(edges.scores, axis=0), nodes.scores, atol=1e-5)
    assert np.isnan(edges.scores).sum() == (~build_graph(model.cfg).valid).sum()


def _refuses_edges(model, call) -> bool:
    """On BLOOM (forks after the norm) every edge probe refuses in one line."""
    if model.cfg.model_type != "bloom":
        return False
    with pytest.raises(
        ValueError,
        match="after the layer norm .* edge attribution, path patching and circuits do not run",
    ):
        call()
    return True


def test_path_patching_on_a_bridge_equals_a_naive_loop_over_edges(bridged):
    arch, bridge, model = bridged
    pairs = _pairs(8, seed=2)
    if _refuses_edges(model, lambda: path_patch(model, pairs)):
        return
    mask = pairs.clean.pad_mask
    edges = [
        ("L0H1", "L1H2", "q"),
        ("L0H0", "L1H0", "k"),
        ("embed", "L1H1", "v"),
        ("L0H2", "MLP0", None),
        ("L1H0", "logits", None),
        ("MLP0", "L1H2", "q"),
    ]
    graph = build_graph(model.cfg)
    with torch.no_grad():
        _, c_cache = bridge.run_with_cache(pairs.clean.tokens, attention_mask=mask.long())
        _, k_cache = bridge.run_with_cache(pairs.corrupt.tokens, attention_mask=mask.long())

    def term(cache, name):
        if name == "embed":
            return cache[graph.embed_hook]
        if name.startswith("MLP"):
            return cache[f"blocks.{name[3:]}.hook_mlp_out"]
        layer, h = int(name[1]), int(name[3])
        return cache[f"blocks.{layer}.attn.hook_z"][:, :, h] @ bridge.blocks[layer].attn.W_O[h]

    for sender, receiver, comp in edges:
        if arch == "gpt-neox" and receiver == "MLP0":  # side by side: MLP0 reads no layer-0 head
            with pytest.raises(ValueError, match="no edge|not a writer"):
                graph.check_edge(sender, receiver)
            continue
        delta = term(c_cache, sender) - term(k_cache, sender)
        if receiver == "logits":
            hook, fork = "blocks.1.hook_resid_post", None
        elif receiver.startswith("MLP"):
            hook, fork = f"blocks.{receiver[3:]}.{graph.mlp_in_hook}", None
        else:
            hook, fork = f"blocks.{receiver[1]}.attn.hook_{comp}_input", int(receiver[3])

        def add(x, hook, delta=delta, fork=fork):
            x = x.clone()
            if fork is None:
                return x + delta
            x[:, :, fork] += delta
            return x

        with forks(model), torch.no_grad(), model.hooks(fwd_hooks=[(hook, add)]):
            logits = model.forward_unchecked(pairs.corrupt.tokens, mask)
        want = (
            logits.gather(1, pairs.clean.labels[:, None])
            - logits.gather(1, pairs.corrupt.labels[:, None])
        ).mean()
        got = path_patch(
            model, pairs, senders=[sender], receivers=[receiver], component=comp or "q"
        )
        assert abs(got.values[0, 0] - float(want)) <= 1e-5, (
            sender,
            receiver,
            got.values,
            float(want),
        )


def test_atp_star_and_the_circuit_rule_run_on_a_bridge(bridged):
    """atp* recomputes q/k softmaxes through the bridge's own forward (stopped after the layer); a
    circuit with every edge kept is the clean run, with none the corrupt one."""
    _, _, model = bridged
    pairs = _pairs(6, seed=3)
    if _refuses_edges(model, lambda: attribute(model, pairs, method="atp*")):
        return
    star = attribute(model, pairs, method="atp*", granularity="edge", metric="logit_diff")
    plain = attribute(model, pairs, method="atp", granularity="edge", metric="logit_diff")
    graph = build_graph(model.cfg)
    v = [
        i
        for i, r in enumerate(graph.readers)
        if r.endswith(".v") or r in ("logits",) or r.startswith("MLP")
    ]
    # edges into values, MLPs and the readout are linearised the same way by both methods
    np.testing.assert_allclose(star.scores[v], plain.scores[v], atol=1e-6, equal_nan=True)
    assert np.isfinite(star.magnitude[graph.valid]).all()
    c, k = as_pair(model, pairs, None)
    with forks(model), torch.no_grad():
        repl = contributions(model, graph, capture(model, k, writer_hooks(graph))[0])
        keep = torch.stack(
            [
                torch.ones_like(torch.as_tensor(graph.valid)),
                torch.zeros_like(torch.as_tensor(graph.valid)),
            ]
        )
        fn = lambda lg, g, b: lg.gather(1, g[:, None])[:, 0] - lg.gather(1, b[:, None])[:, 0]  # noqa: E731
        m = ablated_metric(model, graph, c, repl, keep, fn, c.labels, k.labels).mean(1)
    assert abs(float(m[0]) - star.clean_metric) <= 1e-5
    assert abs(float(m[1]) - star.corrupt_metric) <= 1e-5

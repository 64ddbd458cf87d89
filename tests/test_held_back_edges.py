"""The edge probes (edge attribution, path patching, circuits) on the families no other test builds
(issue 47, item 3; the families of ``test_held_back_families``). Whether an edge can be carried is
read from the bridge (:func:`pe_interp.models.bridge.forward.check_edges`), not from its model type: a
family whose heads each write their own ``z_h W_O[h]`` to the residual, or their own term inside a
norm after the attention (Gemma 2 and 3, OLMo 2, whose norm the probes recompute:
``tests/test_post_norm_edges.py``), and whose per-head forks come before the layer norm runs (each
family built here with one key/value head per query head), and the forks are checked against the
Hugging Face layer's own norm input (the attention's input where no norm comes before it). Grouped
key/value heads get a k and a v reader per key/value head (``tests/test_bridge_gqa_edges.py``
holds them to finite differences and naive loops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from test_held_back_families import (  # noqa: F401
    ANSWERS,
    COMMON,
    FAMILIES,
    TOK,
    H,
    _examples,
    _pairs,
    families,
)

from pe_interp.models.bridge.forward import check_edges
from pe_interp.models.bridge.hf_arch import boot_bridge, save_model_dir
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.tasks.batch import Batch, CounterfactualPairs
from probes import attribute, path_patch
from probes.circuits.engine import forks
from probes.circuits.graph import build_graph


def _counterfactuals() -> CounterfactualPairs:
    clean, corrupt, good, bad = _pairs()
    mask = torch.ones_like(clean, dtype=torch.bool)
    return CounterfactualPairs(Batch(clean, good, mask), Batch(corrupt, bad, mask))


def _ungrouped(family: str, tmp_path) -> BridgedModel:
    """The family's tiny model with one key/value head per query head, as a bridge."""
    cls, own = FAMILIES[family]
    config = getattr(transformers, cls)(**{**COMMON, "num_key_value_heads": H}, **own)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    return BridgedModel(boot_bridge(save_model_dir(hf, TOK, tmp_path / "model")), answers=ANSWERS)


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_grouped_key_value_heads_get_a_k_and_a_v_reader_each(families, family):  # noqa: F811
    """k/v forks come one per key/value head, and so do the edge graph's k/v readers, also under a
    norm after attention (Gemma 3); path patching reaches a key/value head's receivers."""
    _, model, _ = families(family)
    assert check_edges(model.bridge, 30) is None
    pairs = _counterfactuals()
    graph = build_graph(model.cfg)
    assert graph.fork_readers(1, "k") == ["L1KV0.k", "L1KV1.k"]
    nodes = attribute(model, pairs)
    edges = attribute(model, pairs, granularity="edge")
    assert edges.readers == graph.readers
    np.testing.assert_allclose(np.nansum(edges.scores, axis=0), nodes.scores, atol=1e-5)
    pp = path_patch(model, pairs, None, ["embed", "L0H0"], ["L1KV0.k", "L1KV1.v"], "k")
    assert pp.receivers == ("L1KV0.k", "L1KV1.v") and np.isfinite(pp.values).all()
    assert np.abs(pp.effects).max() > 0  # the patched key/value head moves the answer


@pytest.mark.parametrize("family", list(FAMILIES))
def test_edges_run_where_each_head_writes_its_own_term_or_its_own_inside_a_norm(family, tmp_path):
    model = _ungrouped(family, tmp_path)
    pairs = _counterfactuals()
    assert check_edges(model.bridge, 30) is None
    # the forks: a delta at every head's q, k and v input of layer 1 is a delta at the input of
    # the norm that the Hugging Face layer puts before its attention (at the attention's own
    # input where there is none, as in OLMo 2)
    tokens, mask, _ = _examples()
    d = torch.randn(*tokens.shape, model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    hf = model.bridge.original_model
    layer = hf.model.layers[1]
    if hasattr(layer, "input_layernorm"):
        handle = layer.input_layernorm.register_forward_pre_hook(lambda m, args: (args[0] + d,))
    else:
        handle = layer.self_attn.register_forward_pre_hook(
            lambda m, args, kw: (args, {**kw, "hidden_states": kw["hidden_states"] + d}),
            with_kwargs=True,
        )
    try:
        with torch.no_grad():
            logits = hf(tokens, attention_mask=mask.long()).logits
    finally:
        handle.remove()
    want = logits[torch.arange(len(mask)), mask.sum(1) - 1][:, ANSWERS]
    names = [f"blocks.1.attn.hook_{c}_input" for c in "qkv"]
    with (
        forks(model),
        torch.no_grad(),
        model.hooks(fwd_hooks=[(n, lambda x, hook: x + d[:, :, None]) for n in names]),
    ):
        got = model.forward_unchecked(tokens, mask)
    with torch.no_grad():
        clean = model(tokens, mask)
    assert float((got - clean).abs().max()) > 1e-3  # the delta matters
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    # the chain rule through every fork: each writer's edges add up to its node score
    nodes = attribute(model, pairs)
    edges = attribute(model, pairs, granularity="edge")
    np.testing.assert_allclose(np.nansum(edges.scores, axis=0), nodes.scores, atol=1e-5)
    assert np.isnan(edges.scores).sum() == (~build_graph(model.cfg).valid).sum()


def test_a_residual_far_larger_than_each_layers_write_is_no_reason_to_refuse(tmp_path):
    """SmolLM2's massive activations: float32 rounding of the residual's size shows up in the
    difference of two of them; the check compares at the residual's scale (a Llama whose
    embeddings are a million times their initialisation)."""
    from pe_interp.models.bridge.hf_arch import build_hf_model, word_tokenizer

    hf = build_hf_model(
        "llama", seed=2, n_layers=2, d_model=32, n_heads=4, d_mlp=40, n_ctx=16, d_vocab=30, pad_id=0
    )
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(1e6)
    bridge = boot_bridge(save_model_dir(hf, word_tokenizer(30, 0), tmp_path / "m"))
    tokens = torch.randint(1, 30, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens)
    step = cache["blocks.1.hook_resid_post"] - cache["blocks.1.hook_resid_pre"]
    assert float(cache["blocks.1.hook_resid_post"].abs().max()) > 1e4 * float(step.abs().max())
    assert check_edges(bridge, 30) is None

"""The model seam (pe_interp.models.protocol, issue 46): both model kinds implement ProbeModel, a probe
checks a model against it at its door, and a raw TransformerLens bridge is wrapped there, so that
``probes.ablate_heads(bridge, tokens, labels)`` runs and equals the same sweep on a BridgedModel and
a naive hook loop on the bridge itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.models.bridge.hf_arch import (
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.models.conformance import missing
from pe_interp.models.protocol import (
    HOOKS,
    KVLayout,
    PositionView,
    ProbeModel,
    layer_of,
)
from probes import ablate_heads, patch
from probes.common.inputs import as_probe_model

V, PAD = 30, 0
SHAPE = {"n_layers": 2, "d_model": 24, "n_heads": 3, "d_mlp": 40, "n_ctx": 16, "d_vocab": V}


@pytest.fixture(scope="module")
def llama_bridge(tmp_path_factory):
    hf = build_hf_model("llama", seed=5, pad_id=PAD, **SHAPE)
    out = save_model_dir(hf, word_tokenizer(V, PAD), tmp_path_factory.mktemp("llama") / "m")
    return boot_bridge(out)


def _ours() -> HookedPETransformer:
    return HookedPETransformer(
        ModelConfig(encoding="rope", n_layers=2, d_model=16, n_heads=2, d_vocab=12, n_ctx=10)
    )


def test_both_model_kinds_implement_the_protocol(llama_bridge):
    ours, bridged = _ours(), BridgedModel(llama_bridge)
    for model in (ours, bridged):
        assert isinstance(model, ProbeModel)
        assert missing(model) == []
    assert (ours.restart, ours.can_restart, ours.can_resume) == ("resid_mid", True, True)
    assert (bridged.restart, bridged.can_restart, bridged.can_resume) == ("resid_pre", False, True)
    assert ours.kv_layout == KVLayout(2, 2) and not ours.kv_layout.grouped
    assert bridged.kv_layout.n_kv_heads == llama_bridge.original_model.config.num_key_value_heads


def test_a_model_that_lacks_a_seam_is_refused_in_one_line_naming_it():
    class Half(torch.nn.Module):
        cfg = _ours().cfg

        def run_with_hooks(self, *a, **k):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(
        ValueError, match=r"^ablate_heads: model must be .* got Half, which lacks restart"
    ) as e:
        ablate_heads(Half(), torch.ones(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="lacks"):
        patch(Half(), torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))


def test_both_encodings_implement_the_position_view(llama_bridge):
    """``model.encoding`` is a PositionView on both kinds: our encodings answer every name the
    probes read with the base class's defaults, a bridge's from its forward."""
    ours, bridged = _ours(), BridgedModel(llama_bridge)
    for model in (ours, bridged):
        assert isinstance(model.encoding, PositionView)
    enc = ours.encoding
    assert (enc.sized_spans, enc.rotates, enc.has_bias, enc.decomposes) == (
        False,
        True,
        False,
        True,
    )
    assert enc.cannot_move is None and enc.unrotated_hooks is None
    assert enc.rotation_hooks == ("hook_rot_q", "hook_rot_k")
    assert enc.unfrozen_norms(0) == [] and enc.head_parameters() == {}
    assert enc.move_bias(0, torch.arange(4)[None], torch.ones(1, 2, dtype=torch.bool)) is None
    assert enc.rotary_spans(0)[0].cos.shape[0] == ours.cfg.n_ctx
    enc = bridged.encoding
    assert (enc.sized_spans, enc.rotates, enc.has_bias, enc.decomposes) == (True, True, False, True)
    assert enc.cannot_move is None
    assert enc.rotation_hooks == enc.unrotated_hooks == ("hook_q", "hook_k")
    assert enc.unfrozen_norms(0) == [] and enc.head_parameters() == {}
    assert enc.residual(3) is None and enc.bias(3, 3, 0) is None
    assert 5 <= enc.rotary_spans(0, 5)[0].cos.shape[0] < bridged.cfg.n_ctx  # the length asked


def test_a_model_without_a_position_view_is_refused_in_one_line_naming_it():
    ours = _ours()
    names = ("cfg", "restart", "kv_layout", "W_E", "blocks", "can_restart", "can_resume")
    names += ("check_inputs", "forward_unchecked", "resume", "run_with_hooks", "run_with_cache")
    names += (
        "hooks",
        "attention_scale",
        "check_forks",
        "post_norm",
        "set_use_split_qkv_input",
        "set_use_attn_in",
    )
    no_encoding = SimpleNamespace(set_use_hook_mlp_in=ours.set_use_hook_mlp_in)
    for name in names:
        setattr(no_encoding, name, getattr(ours, name))
    assert missing(no_encoding) == ["encoding"]
    tokens, labels = torch.ones(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^ablate_heads: .* which lacks encoding$") as e:
        ablate_heads(no_encoding, tokens, labels)
    assert "\n" not in str(e.value)
    ours.encoding = torch.nn.Identity()  # an encoding that says nothing of its positions
    assert "encoding.cannot_move" in missing(ours) and "encoding.rotary_spans" in missing(ours)
    with pytest.raises(ValueError, match=r"^ablate_heads: .* which lacks encoding\.sized_spans"):
        ablate_heads(ours, tokens, labels)


def test_kv_layout_groups_consecutive_query_heads():
    layout = KVLayout(9, 3)
    assert layout.group == 3 and layout.grouped
    assert [layout.kv_head(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert list(layout.query_heads(2)) == [6, 7, 8]
    k = torch.arange(3.0).view(1, 1, 3, 1)  # [batch, pos, kv head, d]
    assert layout.per_query_head(k).flatten().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert KVLayout(4, 1).kv_head(3) == 0  # multi-query
    with pytest.raises(ValueError, match="cannot share 2 key/value heads evenly"):
        KVLayout(3, 2)


def test_hook_names_and_layer_of_follow_transformer_lens():
    model = _ours()
    assert HOOKS.z(1) == "blocks.1.attn.hook_z" and HOOKS.resid_mid(0) == "blocks.0.hook_resid_mid"
    for name in (HOOKS.z(1), HOOKS.resid_pre(0), HOOKS.attn(1, "pattern")):
        assert layer_of(model.hook_dict[name]) == int(name.split(".")[1])


def test_our_resume_equals_the_full_forward():
    model = _ours().eval()
    tokens = torch.randint(1, 12, (4, 7), generator=torch.Generator().manual_seed(0))
    logits, cache = model.run_with_cache(tokens)
    for layer in (0, 1):
        got = model.resume(tokens, layer, cache[HOOKS.resid_pre(layer)], None)
        torch.testing.assert_close(got, logits, atol=1e-6, rtol=0)


def test_ablate_heads_takes_a_raw_bridge(llama_bridge):
    """Answers default to every token: a label is the answer's token id (read at the last token)."""
    assert isinstance(as_probe_model(llama_bridge), BridgedModel)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, V, (12, 9), generator=g)
    labels = torch.randint(1, V, (12,), generator=g)
    raw = ablate_heads(llama_bridge, tokens, labels, metric="logit", n_bootstrap=0)
    wrapped = ablate_heads(
        BridgedModel(llama_bridge), tokens, labels, metric="logit", n_bootstrap=0
    )
    np.testing.assert_array_equal(raw.values, wrapped.values)
    for layer in range(2):
        for h in range(3):

            def zero(z, hook, h=h):
                z = z.clone()
                z[:, :, h] = 0.0
                return z

            with torch.no_grad():
                out = llama_bridge.run_with_hooks(tokens, fwd_hooks=[(HOOKS.z(layer), zero)])
            want = out[:, -1].gather(1, labels[:, None])[:, 0].double().mean()
            assert abs(raw.values[layer, h] - float(want)) <= 1e-5

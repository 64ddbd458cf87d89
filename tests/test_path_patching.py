"""probes.path_patch against TransformerLens' get_act_patch_direct_path (head senders, q/k/v
receivers) and against naive hook loops written here for what TransformerLens does not patch
(embedding and MLP senders, MLP and readout receivers, keys and values read from the
embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import cache_of, class_metric, forks, random_model, random_pairs
from transformer_lens import patching as tlp

from pe_interp.config.model import KV_EMBED_NO_EDGES
from probes import PathPatch, path_patch
from probes.circuits.engine import contributions, writer_hooks
from probes.circuits.graph import build_graph

FN = lambda logits, good, bad: logits[:, 1] - logits[:, 0]  # noqa: E731
HEADS = [f"L{layer}H{h}" for layer in range(3) for h in range(2)]


def tl_metric(logits):
    return class_metric(1, 0)(logits) / logits.shape[0]  # the batch mean of FN


@pytest.mark.parametrize("encoding", ["rope", "t5", "alibi", "sinusoidal"])
@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_head_to_head_paths_equal_transformer_lens(encoding, component):
    model = random_model(encoding)
    clean, corrupt = random_pairs()
    ours = path_patch(model, clean, corrupt, HEADS, HEADS, component, metric=FN, batch_size=5)
    cc, kc = cache_of(model, clean), cache_of(model, corrupt)
    for sl in range(2):
        for sh in range(2):
            tl = tlp.get_act_patch_direct_path(
                model, corrupt, cc, kc, tl_metric, sl, sh, component, verbose=False
            )
            row = ours.values[ours.senders.index(f"L{sl}H{sh}")]
            for dl in range(3):
                for dh in range(2):
                    got = row[ours.receivers.index(f"L{dl}H{dh}.{component}")]
                    if dl <= sl:
                        assert np.isnan(got)  # no such path (TL: a 0.0 placeholder)
                    else:
                        assert got == pytest.approx(
                            float(tl[dl, dh]), rel=1e-5, abs=1e-6
                        )  # TL stores float32
    assert np.nanmax(np.abs(ours.effects)) > 1e-3  # far above the tolerance, so a wrong path shows


def naive(model, clean, corrupt, sender: str, hook: str, head: int | None) -> float:
    """A full corrupt forward with ``sender``'s clean-minus-corrupt term added at one reader hook
    (one head's fork when ``head`` is given)."""
    graph = build_graph(model.cfg)
    ca, ka = cache_of(model, clean), cache_of(model, corrupt)
    w = {n: ca[n] for n in writer_hooks(graph)}
    delta = (contributions(model, graph, w) - contributions(model, graph, {n: ka[n] for n in w}))[
        :, :, graph.writer_index(sender)
    ]

    def add(x, hook):
        x = x.clone()
        if head is None:
            x += delta
        else:
            x[:, :, head] += delta
        return x

    with forks(model), torch.no_grad():
        logits = model.run_with_hooks(corrupt, fwd_hooks=[(hook, add)])
    return float(FN(logits, None, None).mean())


def test_embed_and_mlp_senders_and_mlp_and_readout_receivers_equal_naive_loops():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    receivers = ["L2H1", "MLP1", "logits", "MLP0"]
    ours = path_patch(
        model, clean, corrupt, ["embed", "MLP0", "L1H0", "MLP2"], receivers, "k", metric=FN
    )
    hooks = {
        "L2H1.k": ("blocks.2.attn.hook_k_input", 1),
        "MLP1": ("blocks.1.hook_mlp_in", None),
        "logits": ("blocks.2.hook_resid_post", None),
        "MLP0": ("blocks.0.hook_mlp_in", None),
    }
    graph = build_graph(model.cfg)
    for s in ours.senders:
        for r in ours.receivers:
            got = ours.values[ours.senders.index(s), ours.receivers.index(r)]
            if not graph.valid[graph.reader_index(r), graph.writer_index(s)]:
                assert np.isnan(got), (s, r)
                continue
            assert got == pytest.approx(
                naive(model, clean, corrupt, s, *hooks[r]), rel=1e-9, abs=1e-12
            ), (s, r)
    assert (
        np.isnan(ours.values[ours.senders.index("MLP2")]).sum() == 3
    )  # MLP2 feeds only the readout


def test_embed_kv_model_takes_embed_paths_into_keys_and_refuses_head_paths():
    model = random_model("sinusoidal", kv_source="embed")
    clean, corrupt = random_pairs()
    ours = path_patch(model, clean, corrupt, ["embed"], ["L1H0", "L2H1"], "v", metric=FN)
    want = naive(model, clean, corrupt, "embed", "blocks.2.attn.hook_v_input", 1)
    assert ours.values[0, 1] == pytest.approx(want, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError) as err:
        path_patch(model, clean, corrupt, ["embed", "L0H1"], ["L1H0"], "k", metric=FN)
    assert str(err.value) == KV_EMBED_NO_EDGES
    q = path_patch(
        model, clean, corrupt, ["L0H1"], ["L2H0"], "q", metric=FN
    )  # queries read the residual
    assert q.values[0, 0] == pytest.approx(
        naive(model, clean, corrupt, "L0H1", "blocks.2.attn.hook_q_input", 0), rel=1e-9
    )


def test_defaults_save_and_load(tmp_path):
    model = random_model("t5")
    clean, corrupt = random_pairs()
    full = path_patch(model, clean, corrupt, metric=FN)
    assert len(full.senders) == len(build_graph(model.cfg).writers)
    assert set(full.receivers) >= {"logits", "MLP2", "L2H1.q"} and "L2H1.k" not in full.receivers
    back = PathPatch.load(full.save(tmp_path / "p.json"))
    np.testing.assert_array_equal(back.values, full.values)
    assert back.effect("L0H0", "L1H1.q") == full.effect("L0H0", "L1H1.q")
    for bad in (dict(component="z"), dict(senders=["L9H0"]), dict(receivers=["MLP7"])):
        with pytest.raises(ValueError):
            path_patch(model, clean, corrupt, **{"metric": FN, **bad})


@pytest.mark.parametrize("encoding", ["rope", "alibi", "sinusoidal"])
def test_the_hook_only_paths_a_bridge_takes_equal_the_restart_seams(encoding, monkeypatch):
    """A bridge has no seam to restart a layer at: its path patching adds each sender's term at the
    receiver's hook in a whole corrupt forward, and atp* recomputes a layer's softmax by a forward
    stopped after it. On our model both equal the restart path they replace."""
    import probes.circuits.engine as engine
    import probes.circuits.path_patching as pp
    from probes import attribute

    model = random_model(encoding)
    clean, corrupt = random_pairs()
    fast = path_patch(model, clean, corrupt, metric=FN, batch_size=7)
    fast_star = attribute(model, clean, corrupt, method="atp*", granularity="edge", metric=FN)
    monkeypatch.setattr(type(model), "can_restart", False, raising=False)

    def no_seam(*args, **kwargs):
        raise AssertionError("a restart seam was used")

    monkeypatch.setattr(pp, "site_restarted", no_seam)
    monkeypatch.setattr(engine, "no_forks", no_seam)  # the restart path of attend_with
    hooked = path_patch(model, clean, corrupt, metric=FN, batch_size=7)
    hooked_star = attribute(model, clean, corrupt, method="atp*", granularity="edge", metric=FN)
    np.testing.assert_allclose(hooked.values, fast.values, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(hooked_star.scores, fast_star.scores, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(hooked_star.magnitude, fast_star.magnitude, rtol=1e-9, atol=1e-10)
    assert np.nanmax(np.abs(fast.effects)) > 1e-3

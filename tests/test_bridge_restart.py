"""What a bridge's forward costs (issue 47, item 6): a restart at a layer's input runs that layer and
the ones after it only (the bridge's own ``start_at_layer`` ran every block and discarded the
early ones), and a forward that returns class logits unembeds only the read position. Both
exact: the sweep's drops and per-example logits equal a naive loop written on the bridge itself
(every head zeroed on ``hook_z`` in a whole forward, every position unembedded) to 1e-5, on a
tiny Llama with grouped key/value heads and right padding, built from its config offline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_interp.models.bridge.hf_arch import (
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel, skipping_blocks
from probes import ablate_heads, ablate_heads_naive
from probes.ablation.sweeps import even_split

V, PAD, L, H = 40, 0, 4, 4
ANSWERS = [36, 37, 38, 39]
SHAPE = {"n_layers": L, "d_model": 32, "n_heads": H, "n_kv_heads": 2, "d_mlp": 48, "n_ctx": 16}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    hf = build_hf_model("llama", seed=7, d_vocab=V, pad_id=PAD, **SHAPE)
    with torch.no_grad():  # sharper attention, so that a head's removal moves the answer
        for name, p in hf.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(3.0)
    out = save_model_dir(hf, word_tokenizer(V, PAD), tmp_path_factory.mktemp("llama") / "m")
    return boot_bridge(out)


def _examples(n: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 11, (n,), generator=g)
    tokens = torch.randint(1, 36, (n, 10), generator=g)
    mask = torch.arange(10)[None] < lengths[:, None]
    tokens[~mask] = PAD
    return tokens, mask, torch.randint(0, len(ANSWERS), (n,), generator=g)


class Rows:
    """Rows through each block's first norm (a block passed by runs none) and through the
    unembedding, with the positions it saw."""

    def __init__(self, bridge):
        self.blocks = [0] * len(bridge.blocks)
        self.unembed: list[tuple[int, int]] = []
        self.handles = [
            b.ln1.register_forward_pre_hook(lambda m, a, i=i: self._add(i, a[0]))
            for i, b in enumerate(bridge.blocks)
        ]
        self.handles.append(
            bridge.unembed.register_forward_pre_hook(
                lambda m, a: self.unembed.append(tuple(a[0].shape[:2]))
            )
        )

    def _add(self, i, x):
        self.blocks[i] += x.shape[0]

    def close(self):
        for h in self.handles:
            h.remove()


def _naive_logits(bridge, tokens, mask, layer=None, head=None):
    """The user's loop: a whole forward, a hook zeroing one head's hook_z, every position
    unembedded, the answers read at the last real token."""

    def zero(z, hook):
        z = z.clone()
        z[:, :, head] = 0.0
        return z

    hooks = [] if layer is None else [(f"blocks.{layer}.attn.hook_z", zero)]
    with torch.no_grad():
        logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks, attention_mask=mask.long())
    assert logits.shape[1] == tokens.shape[1]  # the user's forward unembeds every position
    return logits[torch.arange(len(tokens)), mask.sum(1) - 1][:, ANSWERS]


def test_a_restart_runs_its_layer_and_the_later_ones_only_and_equals_the_forward(bridge):
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, _ = _examples()
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, attention_mask=mask.long())
        want = _naive_logits(bridge, tokens, mask)
        for layer in range(L):
            rows = Rows(bridge)
            try:
                got = model.resume(tokens, layer, cache[f"blocks.{layer}.hook_resid_pre"], mask)
            finally:
                rows.close()
            assert torch.allclose(got, want, atol=1e-5), (layer, (got - want).abs().max())
            assert rows.blocks == [0] * layer + [len(tokens)] * (L - layer)
            assert rows.unembed == [(len(tokens), 1)]  # the read position of each row only
    # the blocks are whole again afterwards: their own forward, the Hugging Face layers untouched
    assert all("forward" not in vars(b) for b in bridge.blocks)
    assert all("forward" not in vars(b.original_component) for b in bridge.blocks)
    rows = Rows(bridge)
    try:
        with torch.no_grad():
            model(tokens, mask)
    finally:
        rows.close()
    assert rows.blocks == [len(tokens)] * L


def test_blocks_are_restored_when_the_restarted_forward_raises(bridge):
    def boom(x, hook):
        raise RuntimeError("boom")

    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, _ = _examples()
    resid = torch.zeros(len(tokens), tokens.shape[1], SHAPE["d_model"])
    with pytest.raises(RuntimeError, match="boom"):
        model.resume(tokens, 2, resid, mask, fwd_hooks=[("blocks.3.attn.hook_z", boom)])
    assert all("forward" not in vars(b) for b in bridge.blocks)
    with skipping_blocks(bridge, 3):
        assert all("forward" in vars(b) for b in list(bridge.blocks)[:3])
        assert "forward" not in vars(bridge.blocks[3])
    assert all("forward" not in vars(b) for b in bridge.blocks)


def test_a_restart_refuses_hooks_on_the_blocks_it_does_not_run(bridge):
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, _ = _examples()
    resid = torch.zeros(len(tokens), tokens.shape[1], SHAPE["d_model"])
    with pytest.raises(
        ValueError, match=r"runs no earlier block; hooks on blocks\.0\.attn\.hook_z"
    ):
        model.resume(
            tokens, 2, resid, mask, fwd_hooks=[("blocks.0.attn.hook_z", lambda x, hook: x)]
        )


def test_class_logits_unembed_the_read_position_unless_a_hook_reads_the_unembedding(bridge):
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, _ = _examples()
    want = _naive_logits(bridge, tokens, mask)
    n, w = tokens.shape
    seen = []
    rows = Rows(bridge)
    try:
        with torch.no_grad():
            for got in (
                model(tokens, mask),
                model.forward_unchecked(tokens, mask),
                model.run_with_hooks(
                    tokens, mask, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x)]
                ),
                model.run_with_cache(tokens, mask, names_filter=["blocks.0.attn.hook_z"])[0],
            ):
                assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
            assert rows.unembed == [(n, 1)] * 4
            got = model.run_with_hooks(
                tokens,
                mask,
                fwd_hooks=[("unembed.hook_in", lambda x, hook: seen.append(x.shape) or x)],
            )
            got2, cache = model.run_with_cache(tokens, mask)  # the whole cache: every position
    finally:
        rows.close()
    assert seen == [torch.Size([n, w, SHAPE["d_model"]])]
    assert cache["unembed.hook_in"].shape[:2] == (n, w)
    for g in (got, got2):
        assert torch.allclose(g, want, atol=1e-5)
    # no pads at all: the last position of every row
    full = torch.ones_like(mask)
    assert torch.allclose(model(tokens, full), _naive_logits(bridge, tokens, full), atol=1e-5)


@pytest.mark.parametrize("metric", ["logit", "accuracy", "loss"])
def test_the_exact_sweep_equals_a_naive_hook_z_loop_on_the_bridge(bridge, metric):
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, labels = _examples(seed=1)
    rows = Rows(bridge)
    try:
        got = ablate_heads(
            model, tokens, labels, pad_mask=mask, metric=metric, n_bootstrap=0, per_example=True
        )
    finally:
        rows.close()
    n = len(tokens)
    # one clean forward, then each head of layer l from layer l on: no block runs for nothing
    assert rows.blocks == [n + n * H * (layer + 1) for layer in range(L)]
    assert all(p == 1 for _, p in rows.unembed)

    def value(logits):
        if metric == "logit":
            return logits.gather(1, labels[:, None])[:, 0].double()
        if metric == "accuracy":
            return (logits.argmax(1) == labels).double()
        return torch.nn.functional.cross_entropy(logits, labels, reduction="none").double()

    base = value(_naive_logits(bridge, tokens, mask))
    assert abs(got.baseline - float(base.mean())) <= 1e-5
    changed = 0
    for layer in range(L):
        for h in range(H):
            want = value(_naive_logits(bridge, tokens, mask, layer, h))
            np.testing.assert_allclose(got.per_example[layer, h], want.numpy(), atol=1e-5)
            changed += int((want - base).abs().max() > 1e-3)
    assert changed >= L * H // 2  # the heads matter: the comparison is not of untouched forwards
    naive = ablate_heads_naive(model, tokens, labels, pad_mask=mask, metric=metric, n_bootstrap=0)
    np.testing.assert_allclose(got.drops, naive.drops, atol=1e-5)


def test_the_sweep_shows_progress_with_an_eta(bridge, capsys):
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, labels = _examples()
    ablate_heads(model, tokens, labels, pad_mask=mask, n_bootstrap=0, progress=True, batch_size=8)
    err = capsys.readouterr().err
    assert "ablate (zero, stacked)" in err and "<" in err  # elapsed<remaining
    assert f"{L * H}/{L * H} ablations" in err and "100%" in err
    ablate_heads_naive(model, tokens, labels, pad_mask=mask, n_bootstrap=0, progress=True)
    err = capsys.readouterr().err
    assert "ablate (naive)" in err and f"{L * H}/{L * H} ablations" in err


def test_even_split():
    assert even_split(16, 14) == 8
    assert even_split(9, 8) == 5
    assert even_split(9, 16) == 9
    assert even_split(5, 0) == 1
    assert even_split(1, 128) == 1


def test_a_forward_stopped_at_a_layer_runs_the_blocks_before_it_only(bridge):
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, _ = _examples()
    seen = {}
    hooks = [("blocks.1.attn.hook_z", lambda z, hook: seen.__setitem__("z", z))]
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, attention_mask=mask.long())
        rows = Rows(bridge)
        try:
            resid = model.run_with_hooks(tokens, mask, fwd_hooks=hooks, stop_at_layer=2)
        finally:
            rows.close()
        assert rows.blocks == [len(tokens)] * 2 + [0] * (L - 2) and rows.unembed == []
        assert torch.allclose(resid, cache["blocks.2.hook_resid_pre"], atol=1e-6)
        assert torch.allclose(seen["z"], cache["blocks.1.attn.hook_z"], atol=1e-6)
        whole = model.run_with_hooks(tokens, mask, stop_at_layer=L)  # every block: class logits
    assert torch.allclose(whole, _naive_logits(bridge, tokens, mask), atol=1e-5)


def test_the_attribution_engine_reads_the_same_gradients_and_verifies_exactly(bridge):
    """Gradients through the read position's unembedding only equal those through every
    position's; the verified heads' drops equal the exact grid's."""
    from probes.ablation import Attribution

    model = BridgedModel(bridge, answers=ANSWERS)
    every = BridgedModel(bridge, answers=ANSWERS)
    every._keeps = False  # unembeds every position, as the bridge returns them
    tokens, mask, labels = _examples(seed=2)
    kw = dict(pad_mask=mask, metric="loss", n_bootstrap=0)
    engine = Attribution(steps=2, verify_top=5)
    got = ablate_heads(model, tokens, labels, engine=engine, **kw)
    ref = ablate_heads(every, tokens, labels, engine=engine, **kw)
    np.testing.assert_allclose(got.meta["attribution"], ref.meta["attribution"], atol=1e-5)
    assert got.meta["verified"] == ref.meta["verified"]
    grid = ablate_heads(model, tokens, labels, **kw)
    verified = ~np.isnan(got.drops)
    assert verified.sum() == 5
    np.testing.assert_allclose(got.drops[verified], grid.drops[verified], atol=1e-5)
    # a rise of the loss is a harm: the estimates run with the exact drops, not against them
    # (rank_heads' "loss" estimate was signed the other way, so the worst heads were verified last)
    assert got.meta["stand_in"] == "loss"
    est = np.asarray(got.meta["attribution"])
    assert np.corrcoef(est.ravel(), grid.drops.ravel())[0, 1] > 0.5
    assert np.unravel_index(np.argmax(grid.drops), grid.drops.shape) in {
        tuple(h) for h in got.meta["verified"]
    }


@pytest.mark.parametrize("site", ["z", "q", "k", "v", "pattern", "attn_out", "mlp_out"])
def test_patching_on_a_bridge_runs_each_layer_from_its_input(bridge, site, capsys, monkeypatch):
    """Head patching resumes at the patched layer's input (the receiving run's, cached): layer l's
    cells run blocks l.. only, and every value equals the same patching run from the embedding
    (the bridge's whole forward with the patching hook; ``can_resume`` off); key/value sites
    patch the key/value heads. The bar counts the patches."""
    from probes import patch

    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, good = _examples(10, seed=3)
    g = torch.Generator().manual_seed(4)
    corrupt = torch.where(mask, torch.randint(1, 36, tokens.shape, generator=g), tokens)
    kw = dict(clean_labels=good, corrupt_labels=(good + 1) % 4, pad_mask=mask, n_bootstrap=0)
    kw |= dict(site=site, by_position=False)
    rows = Rows(bridge)
    try:
        fast = patch(model, tokens, corrupt, progress=True, **kw)
    finally:
        rows.close()
    n, cells = len(tokens), fast.values[0].numel()  # heads, or one cell a layer
    # the pairs' check (clean, corrupt) and the two cached runs through every block, then each
    # layer's cells from that layer on
    assert rows.blocks == [n * (4 + cells * (layer + 1)) for layer in range(L)]
    assert f"{L * cells}/{L * cells} patches" in capsys.readouterr().err
    monkeypatch.setattr(BridgedModel, "can_resume", property(lambda self: False))
    rows = Rows(bridge)
    try:
        slow = patch(model, tokens, corrupt, **kw)
    finally:
        rows.close()
    assert rows.blocks == [n * (4 + cells * L)] * L
    torch.testing.assert_close(fast.values, slow.values, atol=1e-5, rtol=1e-5)


def test_value_patching_on_grouped_heads_equals_a_naive_hook_loop(bridge):
    """``site="v"`` under 4 query heads on 2 key/value heads: one cell per key/value head, each
    equal to a whole forward of the corrupt prompts with that head's hook_v taken from the clean
    run (normalised logit difference, written here on the bridge)."""
    from probes import patch

    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, good = _examples(10, seed=3)
    g = torch.Generator().manual_seed(4)
    corrupt = torch.where(mask, torch.randint(1, 36, tokens.shape, generator=g), tokens)
    bad = (good + 1) % 4
    got = patch(
        model,
        tokens,
        corrupt,
        site="v",
        clean_labels=good,
        corrupt_labels=bad,
        pad_mask=mask,
        n_bootstrap=0,
    )
    assert got.values.shape == (L, 2)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, attention_mask=mask.long())

    def ld(logits):
        return (logits.gather(1, good[:, None]) - logits.gather(1, bad[:, None]))[:, 0].double()

    ld_clean = ld(_naive_logits(bridge, tokens, mask))
    ld_corrupt = ld(_naive_logits(bridge, corrupt, mask))
    want = torch.empty(L, 2, dtype=torch.float64)
    for layer in range(L):
        for j in range(2):

            def swap(v, hook, j=j, layer=layer):
                v = v.clone()
                v[:, :, j] = cache[f"blocks.{layer}.attn.hook_v"][:, :, j]
                return v

            with torch.no_grad():
                logits = bridge.run_with_hooks(
                    corrupt,
                    fwd_hooks=[(f"blocks.{layer}.attn.hook_v", swap)],
                    attention_mask=mask.long(),
                )
            last = logits[torch.arange(len(tokens)), mask.sum(1) - 1][:, ANSWERS]
            want[layer, j] = ((ld(last) - ld_corrupt) / (ld_clean - ld_corrupt).mean()).mean()
    assert want.abs().max() > 1e-2
    torch.testing.assert_close(got.values.double(), want, atol=1e-5, rtol=1e-5)

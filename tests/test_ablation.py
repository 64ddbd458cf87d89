"""Tests for probes.ablation (head ablation sweeps) and probes.common.metrics (bootstrap).

The batched sweep is checked against two references: the module's naive loop (one full forward
per ablation) and hand-written loops in this file (the authors' W_V zeroing, a masked mean from
``run_with_cache``, a resample from a cached clean run).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from pe_interp import HookedPETransformer
from probes.ablation import (
    AblationResult,
    ablate_heads,
    ablate_heads_naive,
    head_means,
    keep_only,
    resample_sources,
)
from probes.common.metrics import paired_bootstrap

N_EX, WIDTH = 20, 10

CONFIGS = {
    "bidirectional": dict(),
    "causal": dict(attention_dir="causal"),
    "kv-embed": dict(kv_source="embed", encoding="sinusoidal+rope"),
    "no-pad-mask": dict(mask_padding=False, encoding="sinusoidal"),
}


def make_model(**kw) -> HookedPETransformer:
    """The tiny model with 4 heads, a 16-token vocabulary, 4 classes, init_std 0.4, sdpa attention
    and seed 1 (float32, left in training mode)."""
    cfg = dict(n_heads=4, d_vocab=16, n_classes=4, init_std=0.4, attn_backend="sdpa", seed=1)
    return tiny_model(training=True, **{**cfg, **kw})


def make_data(
    n: int = N_EX, width: int = WIDTH, d_vocab: int = 16, n_classes: int = 4, seed: int = 0
):
    """Right-padded random sequences of varied length (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(1, d_vocab, (n, width), generator=g)
    lens = torch.randint(2, width + 1, (n,), generator=g)
    pm = torch.arange(width)[None] < lens[:, None]
    toks[~pm] = 0
    labels = torch.randint(0, n_classes, (n,), generator=g)
    return toks, labels, pm


def per_example(logits: torch.Tensor, labels: torch.Tensor, metric: str) -> torch.Tensor:
    if metric == "accuracy":
        return (logits.argmax(-1) == labels).double()
    if metric == "loss":
        return F.cross_entropy(logits, labels, reduction="none").double()
    return logits.gather(1, labels[:, None])[:, 0].double()


def hooked_logits(model, toks, pm, fns: dict[int, object]) -> torch.Tensor:
    hooks = [(f"blocks.{layer}.attn.hook_z", fn) for layer, fn in fns.items()]
    with torch.no_grad():
        return model.run_with_hooks(toks, pm, fwd_hooks=hooks)


# ------------------------------------------------------------------------------------------------
# batched == naive
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
@pytest.mark.parametrize("metric", ["accuracy", "loss", "logit"])
def test_batched_equals_naive(config, method, metric):
    model = make_model(**CONFIGS[config])
    toks, labels, pm = make_data()
    kw = dict(pad_mask=pm, method=method, metric=metric, per_example=True, n_bootstrap=50, seed=3)
    # batch_size 12 forces several example chunks and several stacked-ablation forwards
    fast = ablate_heads(model, toks, labels, batch_size=12, **kw)
    slow = ablate_heads_naive(model, toks, labels, batch_size=7, **kw)
    assert fast.values.shape == (2, 4) and fast.per_example.shape == (2, 4, N_EX)
    np.testing.assert_allclose(fast.baseline_per_example, slow.baseline_per_example, atol=1e-5)
    np.testing.assert_allclose(fast.per_example, slow.per_example, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(fast.drops, slow.drops, atol=1e-5)
    np.testing.assert_allclose(fast.ci_low, slow.ci_low, atol=1e-5)
    if metric != "accuracy":  # the ablations really do something in this random model
        assert np.abs(fast.drops).max() > 1e-3


@pytest.mark.parametrize("encoding", ["nope", "learned", "t5", "alibi", "rope", "sinusoidal+rope"])
def test_batched_equals_naive_each_encoding(encoding):
    """Cutting each chunk to its longest real sequence is exact for every encoding."""
    model = make_model(encoding=encoding, n_layers=3)
    toks, labels, pm = make_data(n=12)
    fast = ablate_heads(
        model, toks, labels, pad_mask=pm, metric="loss", per_example=True, n_bootstrap=0
    )
    slow = ablate_heads_naive(
        model, toks, labels, pad_mask=pm, metric="loss", per_example=True, n_bootstrap=0
    )
    np.testing.assert_allclose(fast.per_example, slow.per_example, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", ["bidirectional", "kv-embed", "no-pad-mask"])
def test_head_sets_batched_equals_naive(config):
    model = make_model(n_layers=3, **CONFIGS[config])
    toks, labels, pm = make_data()
    sets = [keep_only(model, 0, 2), {(0, 1), (2, 3)}, {(1, 0)}, {(1, 0), (1, 3), (2, 2)}, {(2, 1)}]
    for method in ("zero", "mean", "resample"):
        kw = dict(
            pad_mask=pm,
            method=method,
            metric="loss",
            head_sets=sets,
            per_example=True,
            n_bootstrap=0,
        )
        fast = ablate_heads(model, toks, labels, batch_size=16, **kw)
        slow = ablate_heads_naive(model, toks, labels, **kw)
        assert fast.values.shape == (5,) and not fast.is_grid
        np.testing.assert_allclose(fast.per_example, slow.per_example, atol=1e-5, rtol=1e-5)


def test_zero_equals_handwritten_loop_and_partial_grid():
    model = make_model(n_layers=3)
    toks, labels, pm = make_data()
    res = ablate_heads(
        model,
        toks,
        labels,
        pad_mask=pm,
        metric="loss",
        layers=[1, 2],
        heads=[0, 3],
        per_example=True,
        n_bootstrap=0,
    )
    assert np.isnan(res.values[0]).all() and np.isnan(res.values[:, [1, 2]]).all()
    for layer in (1, 2):
        for h in (0, 3):

            def zero(z, hook, h=h):
                z = z.clone()
                z[:, :, h] = 0.0
                return z

            want = per_example(hooked_logits(model, toks, pm, {layer: zero}), labels, "loss")
            np.testing.assert_allclose(res.per_example[layer, h], want.numpy(), atol=1e-5)
            assert res.values[layer, h] == pytest.approx(want.mean().item(), abs=1e-6)
            assert res.drops[layer, h] == pytest.approx(want.mean().item() - res.baseline, abs=1e-6)


@pytest.mark.parametrize("config", ["bidirectional", "kv-embed"])
def test_zero_ablation_equals_zeroing_value_weights(config):
    """The authors' protocol: zero the head's rows of the value projection and its value bias."""
    model = make_model(n_layers=2, **CONFIGS[config])
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for block in model.blocks:  # non-zero biases, so that zeroing b_V matters
            for b in (block.attn.b_Q, block.attn.b_K, block.attn.b_V, block.attn.b_O):
                b.normal_(0, 0.3, generator=gen)
    toks, labels, pm = make_data()
    res = ablate_heads(
        model, toks, labels, pad_mask=pm, metric="logit", per_example=True, n_bootstrap=0
    )
    for layer in range(2):
        for h in range(4):
            edited = copy.deepcopy(model).eval()
            with torch.no_grad():
                edited.blocks[layer].attn.W_V[h].zero_()
                edited.blocks[layer].attn.b_V[h].zero_()
                logits = edited(toks, pm)
            want = logits.gather(1, labels[:, None])[:, 0].double().numpy()
            np.testing.assert_allclose(res.per_example[layer, h], want, atol=1e-5, rtol=1e-5)


def test_mean_ablation_matches_manual_mean():
    model = make_model()
    toks, labels, pm = make_data()
    ref_toks, _, ref_pm = make_data(n=30, seed=9)
    res = ablate_heads(
        model,
        toks,
        labels,
        pad_mask=pm,
        method="mean",
        metric="loss",
        reference=(ref_toks, ref_pm),
        per_example=True,
        n_bootstrap=0,
    )
    with torch.no_grad():
        _, cache = model.run_with_cache(ref_toks, ref_pm)
    for layer in range(2):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # [n, pos, H, D]
        w = ref_pm.double()
        mean = torch.einsum("np,nphd->phd", w, z.double()) / w.sum(0)[:, None, None]
        np.testing.assert_allclose(
            head_means(model, ref_toks, ref_pm)[layer].numpy(), mean.float().numpy(), atol=1e-6
        )
        for h in range(4):

            def put_mean(z, hook, h=h, mean=mean):
                z = z.clone()
                z[:, :, h] = mean[None, :, h].to(z.dtype)
                return z

            want = per_example(hooked_logits(model, toks, pm, {layer: put_mean}), labels, "loss")
            np.testing.assert_allclose(res.per_example[layer, h], want.numpy(), atol=1e-5)


def test_head_means_fallback_beyond_reference_lengths():
    model = make_model()
    toks, _, pm = make_data(n=6, width=5)
    pm[:, 3:] = False
    toks[~pm] = 0
    means = head_means(model, toks, pm, width=8)
    assert means[0].shape == (8, 4, 4)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, pm)
    z = cache["blocks.0.attn.hook_z"]
    overall = z[pm].mean(0)  # over every real token
    for p in range(3, 8):  # no reference example is that long: the all-token mean
        torch.testing.assert_close(means[0][p], overall, atol=1e-6, rtol=1e-5)


def test_resample_matches_cached_clean_sources():
    model = make_model()
    toks, labels, pm = make_data()
    src = resample_sources(N_EX, None, seed=4)
    assert sorted(src.tolist()) == list(range(N_EX)) and (src != torch.arange(N_EX)).all()
    assert torch.equal(src, resample_sources(N_EX, None, seed=4))
    res = ablate_heads(
        model,
        toks,
        labels,
        pad_mask=pm,
        method="resample",
        metric="logit",
        seed=4,
        per_example=True,
        n_bootstrap=0,
    )
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, pm)
    for layer in range(2):
        zsrc = cache[f"blocks.{layer}.attn.hook_z"][src]
        for h in range(4):

            def put_src(z, hook, h=h, zsrc=zsrc):
                z = z.clone()
                z[:, :, h] = zsrc[:, :, h]
                return z

            want = per_example(hooked_logits(model, toks, pm, {layer: put_src}), labels, "logit")
            np.testing.assert_allclose(res.per_example[layer, h], want.numpy(), atol=1e-5)


def test_resample_with_reference_and_width_check():
    model = make_model()
    toks, labels, pm = make_data()
    ref = make_data(n=7, seed=2)
    fast = ablate_heads(
        model,
        toks,
        labels,
        pad_mask=pm,
        method="resample",
        reference=SimpleNamespace(tokens=ref[0], pad_mask=ref[2]),
        n_bootstrap=0,
        per_example=True,
        metric="loss",
    )
    slow = ablate_heads_naive(
        model,
        toks,
        labels,
        pad_mask=pm,
        method="resample",
        reference=(ref[0], ref[2]),
        n_bootstrap=0,
        per_example=True,
        metric="loss",
    )
    np.testing.assert_allclose(fast.per_example, slow.per_example, atol=1e-5)
    with pytest.raises(ValueError, match="padded length"):
        ablate_heads(model, toks, labels, method="resample", reference=ref[0][:, :6], n_bootstrap=0)


def test_callable_metric_and_direction():
    model = make_model()
    toks, labels, pm = make_data()

    def neg_loss(logits, labels):
        return -F.cross_entropy(logits, labels, reduction="none")

    a = ablate_heads(model, toks, labels, pad_mask=pm, metric=neg_loss, n_bootstrap=0)
    b = ablate_heads(model, toks, labels, pad_mask=pm, metric="loss", n_bootstrap=0)
    assert a.metric == "neg_loss" and a.higher_is_better and not b.higher_is_better
    np.testing.assert_allclose(a.drops, b.drops, atol=1e-6)  # positive = hurt, either way
    c = ablate_heads(
        model, toks, labels, pad_mask=pm, metric=neg_loss, higher_is_better=False, n_bootstrap=0
    )
    np.testing.assert_allclose(c.drops, -a.drops, atol=1e-9)
    with pytest.raises(ValueError, match="one value per example"):
        ablate_heads(model, toks, labels, metric=lambda lg, lb: lg, n_bootstrap=0)


def test_train_mode_restored_and_dropout_off():
    model = make_model(dropout=0.3, attn_dropout=0.2)
    toks, labels, pm = make_data()
    model.eval()
    want = ablate_heads(model, toks, labels, pad_mask=pm, metric="loss", n_bootstrap=0)
    model.train()
    model.blocks[1].eval()  # a mixed state must come back exactly
    got = ablate_heads(model, toks, labels, pad_mask=pm, metric="loss", n_bootstrap=0)
    np.testing.assert_array_equal(got.values, want.values)
    assert model.training and model.blocks[0].training and not model.blocks[1].training
    assert not model.blocks[1].attn.training


def test_validation_errors():
    model = make_model()
    toks, labels, pm = make_data()
    with pytest.raises(ValueError, match="method"):
        ablate_heads(model, toks, labels, method="scramble")
    with pytest.raises(ValueError, match="metric"):
        ablate_heads(model, toks, labels, metric="f1")
    with pytest.raises(ValueError, match="head 4"):
        ablate_heads(model, toks, labels, heads=[4])
    with pytest.raises(ValueError, match="layer 2"):
        ablate_heads(model, toks, labels, head_sets=[{(2, 0)}])
    with pytest.raises(ValueError, match="not both"):
        ablate_heads(model, toks, labels, layers=[0], head_sets=[{(0, 0)}])
    with pytest.raises(ValueError, match="labels"):
        ablate_heads(model, toks, labels[:-1])
    with pytest.raises(ValueError, match="2 examples"):
        ablate_heads(model, toks[:1], labels[:1], method="resample")


def test_keep_only():
    assert keep_only(4, 1, 2) == {(1, 0), (1, 1), (1, 3)}
    assert keep_only(make_model(), 0, 0) == {(0, 1), (0, 2), (0, 3)}
    with pytest.raises(ValueError):
        keep_only(4, 0, 4)


# ------------------------------------------------------------------------------------------------
# bootstrap and serialisation
# ------------------------------------------------------------------------------------------------
def test_bootstrap_is_a_paired_percentile_bootstrap():
    rng = np.random.default_rng(0)
    n, B = 50, 400
    base = (rng.random(n) < 0.8).astype(float)
    abl = np.stack([base * (rng.random(n) < p) for p in (0.3, 0.9, 1.0)])
    low, high = paired_bootstrap(base, abl, n_bootstrap=B, ci=0.9, seed=7)
    # the same replicates by hand: one generator, one [B, n] index draw
    idx = torch.randint(n, (B, n), generator=torch.Generator().manual_seed(7)).numpy()
    reps = (base[None, :] - abl)[:, idx].mean(-1)  # [3, B]
    np.testing.assert_allclose(low, np.quantile(reps, 0.05, axis=1), atol=1e-12)
    np.testing.assert_allclose(high, np.quantile(reps, 0.95, axis=1), atol=1e-12)
    point = (base - abl).mean(1)
    assert (low <= point).all() and (point <= high).all()
    assert low[2] == high[2] == 0.0  # no change in any example: a zero-width CI
    # chunked replicates give the same numbers
    low2, high2 = paired_bootstrap(base, abl, n_bootstrap=B, ci=0.9, seed=7, max_elements=3 * n)
    np.testing.assert_array_equal(low, low2)
    np.testing.assert_array_equal(high, high2)
    # lower-is-better flips the sign
    lo3, hi3 = paired_bootstrap(base, abl, n_bootstrap=B, ci=0.9, seed=7, higher_is_better=False)
    np.testing.assert_allclose(lo3, -high, atol=1e-12)


def test_sweep_ci_contains_estimate_and_is_deterministic():
    model = make_model()
    toks, labels, pm = make_data(n=40)
    kw = dict(pad_mask=pm, metric="loss", n_bootstrap=300, ci=0.95)
    a = ablate_heads(model, toks, labels, seed=11, **kw)
    b = ablate_heads(model, toks, labels, seed=11, **kw)
    c = ablate_heads(model, toks, labels, seed=12, **kw)
    assert (a.ci_low <= a.drops + 1e-12).all() and (a.drops <= a.ci_high + 1e-12).all()
    assert (a.ci_high - a.ci_low > 0).all()
    np.testing.assert_array_equal(a.ci_low, b.ci_low)
    np.testing.assert_array_equal(a.ci_high, b.ci_high)
    assert not np.array_equal(a.ci_low, c.ci_low)
    none = ablate_heads(model, toks, labels, pad_mask=pm, n_bootstrap=0)
    assert np.isnan(none.ci_low).all()


def test_result_json_round_trip(tmp_path):
    model = make_model()
    toks, labels, pm = make_data()
    res = ablate_heads(
        model, toks, labels, pad_mask=pm, layers=[1], per_example=True, n_bootstrap=20
    )
    d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    back = AblationResult.from_dict(d)
    for name in ("values", "drops", "ci_low", "ci_high", "per_example", "baseline_per_example"):
        np.testing.assert_array_equal(getattr(back, name), getattr(res, name))
    assert back.baseline == res.baseline and back.method == "zero" and back.metric == "accuracy"
    assert back.meta["encoding"] == model.cfg.encoding_name
    sets = ablate_heads(
        model, toks, labels, pad_mask=pm, head_sets=[keep_only(model, 0, 1)], n_bootstrap=0
    )
    path = sets.save(tmp_path / "a.json")
    again = AblationResult.load(path)
    assert again.head_sets == sets.head_sets and again.per_example is None
    np.testing.assert_array_equal(again.values, sets.values)
    assert math.isnan(again.ci_low[0])


# ------------------------------------------------------------------------------------------------
# the CLI, on a fake run (load_run is someone else's)
# ------------------------------------------------------------------------------------------------
def test_cli_ablate_writes_outputs(tmp_path, monkeypatch, capsys):
    import pe_interp.runs.load
    from pe_interp.commands import ablate as cmd

    model = make_model().eval()
    toks, labels, pm = make_data(n=30)

    class FakeRun:
        def __init__(self):
            self.model, self.run_dir, self.provenance = model, tmp_path, None
            self.result_dir, self.at_step, self.name = (
                tmp_path,
                None,
                str(tmp_path),
            )  # a Run's final weights

        def examples(self, on="test", n=None):
            assert on == "test"
            n = 30 if n is None else n
            return SimpleNamespace(tokens=toks[:n], labels=labels[:n], pad_mask=pm[:n])

    calls = []
    monkeypatch.setattr(
        pe_interp.runs.load, "load_run", lambda d, device="cpu": calls.append(d) or FakeRun()
    )
    parser = argparse.ArgumentParser()
    cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "ablate",
            str(tmp_path),
            "--n",
            "25",
            "--metric",
            "loss",
            "--n-bootstrap",
            "50",
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    assert args.run is cmd.run
    assert cmd.run(args) == 0
    res = AblationResult.load(tmp_path / "ablation.json")
    assert res.n_examples == 25 and res.metric == "loss" and res.values.shape == (2, 4)
    deposits = json.loads((tmp_path / "deposits.json").read_text())
    assert {"deposits", "layers", "thresholds"} <= set(deposits)
    for name in ("ablation_heatmap.png", "ablation_layers.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert (
        "layer concentration:" in out and "layer" in out
    )  # metric "loss": no single-head deposit verdict (accuracy only)
    assert "single-head deposit" not in out

"""Tests for probes.deposit (deposit detection, dynamics callback) and probes.ablation.view / probes.deposit.view.

The detection tests use hand-built one-layer models whose weights are set so that the signal
needed for the task is known exactly: in one, a single head carries it (a deposit); in the other,
four heads carry equal parts, so each single ablation costs just as much but no head dominates.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.tasks.batch import Batch
from probes.ablation import ablate_heads, keep_only
from probes.ablation.view import plot_drop_heatmap, plot_layer_lines
from probes.deposit import (
    DepositDynamics,
    DepositReport,
    dynamics_arrays,
    find_deposits,
    layer_stats,
    load_dynamics,
    normalized_entropy,
    normalized_gini,
)
from probes.deposit.view import plot_dynamics

A = 1  # the signal token


def hand_built(head_weights: list[float], bias: float = 40.0) -> HookedPETransformer:
    """One attention-only layer, no norms, uniform attention (W_Q = W_K = 0).

    Token t (1..5) embeds as the one-hot e_{t-1}. Head h reads the A-indicator (dim 0) into its
    first value coordinate and writes ``head_weights[h]`` times it into dim 5. Uniform
    attention over the real tokens makes that the fraction f of A tokens, at every position. The
    unembedding reads dim 5 only: logit_1 = 100 f (sum of weights) - bias, logit_0 = 0.
    """
    cfg = ModelConfig(
        n_layers=1,
        d_model=8,
        n_heads=4,
        d_head=2,
        d_mlp=0,
        normalization_type=None,
        encoding="nope",
        n_classes=2,
        d_vocab=6,
        n_ctx=8,
        attn_backend="sdpa",
    )
    model = HookedPETransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for t in range(1, 6):
            model.W_E[t, t - 1] = 1.0
        attn = model.blocks[0].attn
        for h, w in enumerate(head_weights):
            attn.W_V[h, 0, 0] = 1.0
            attn.W_O[h, 0, 5] = w
            attn.W_V[h, 1 + h % 4, 1] = 1.0  # every head also moves something the readout ignores
            attn.W_O[h, 1, 6 + h % 2] = 1.0
        model.W_U[5, 1] = 100.0
        model.b_U[1] = -bias
    return model.eval()


def fraction_data(n: int = 200, seed: int = 0):
    """Label 1: A makes up half of the real tokens (f = 0.5); label 0: a quarter (f = 0.25).
    Lengths 4 or 8, right-padded to 8."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.zeros(n, 8, dtype=torch.long)
    labels = torch.randint(0, 2, (n,), generator=g)
    lengths = torch.where(torch.rand(n, generator=g) < 0.5, 4, 8)
    for i in range(n):
        L = int(lengths[i])
        n_a = L // 2 if labels[i] == 1 else L // 4
        row = torch.cat([torch.full((n_a,), A), torch.randint(2, 6, (L - n_a,), generator=g)])
        toks[i, :L] = row[torch.randperm(L, generator=g)]
    return toks, labels, toks != 0


# ------------------------------------------------------------------------------------------------
# detection
# ------------------------------------------------------------------------------------------------
def test_single_head_model_is_a_deposit_and_spread_model_is_not():
    toks, labels, pm = fraction_data()
    deposit = hand_built([1.0, 0.0, 0.0, 0.0])
    spread = hand_built([0.25, 0.25, 0.25, 0.25])
    r1 = ablate_heads(deposit, toks, labels, pad_mask=pm, n_bootstrap=500)
    r2 = ablate_heads(spread, toks, labels, pad_mask=pm, n_bootstrap=500)
    assert r1.baseline == 1.0 and r2.baseline == 1.0
    half = float((labels == 1).double().mean())  # every label-1 example flips to class 0
    np.testing.assert_allclose(r1.drops[0], [half, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(r2.drops[0], [half] * 4, atol=1e-12)  # as large, but shared

    rep1 = find_deposits(r1)
    s = rep1.layer(0)
    assert rep1.deposits == ((0, 0),)
    assert s.is_deposit and s.top_head == 0 and s.share == 1.0 and s.entropy == 0.0
    assert s.gini == pytest.approx(1.0) and s.margin == pytest.approx(half) and s.ci_separated
    assert s.top_ci[0] <= half <= s.top_ci[1] and s.top_ci[0] > 0.3

    rep2 = find_deposits(r2)
    s2 = rep2.layer(0)
    assert rep2.deposits == () and not s2.is_deposit
    assert (
        s2.share == pytest.approx(0.25)
        and s2.entropy == pytest.approx(1.0)
        and s2.gini == pytest.approx(0.0)
    )
    assert s2.margin == pytest.approx(0.0) and s2.ci_separated is False
    assert any("share" in f for f in s2.failed)

    # Loss as the metric (lower is better): drops are still positive when ablation hurts.
    r3 = ablate_heads(deposit, toks, labels, pad_mask=pm, metric="loss", n_bootstrap=200)
    assert r3.drops[0, 0] > 1.0 and np.allclose(r3.drops[0, 1:], 0.0, atol=1e-9)
    assert find_deposits(r3).deposits == ((0, 0),)
    # A threshold above the drop turns the flag off.
    assert find_deposits(r1, min_drop=0.9).deposits == ()


def test_keep_only_one_head_recovers_what_the_head_carries():
    toks, labels, pm = fraction_data()
    deposit = hand_built([1.0, 0.0, 0.0, 0.0])
    spread = hand_built([0.25, 0.25, 0.25, 0.25])
    sets = [keep_only(deposit, 0, h) for h in range(4)]
    r = ablate_heads(deposit, toks, labels, pad_mask=pm, head_sets=sets, n_bootstrap=0)
    half = float((labels == 0).double().mean())
    np.testing.assert_allclose(
        r.values, [1.0, half, half, half], atol=1e-12
    )  # head 0 alone suffices
    r2 = ablate_heads(spread, toks, labels, pad_mask=pm, head_sets=sets, n_bootstrap=0)
    np.testing.assert_allclose(r2.values, [half] * 4, atol=1e-12)  # no head suffices alone
    with pytest.raises(ValueError, match="head sets"):
        find_deposits(r)


def test_concentration_measures():
    assert normalized_entropy(np.array([0.0, 3.0, 0.0])) == 0.0
    assert normalized_entropy(np.ones(5)) == pytest.approx(1.0)
    assert normalized_gini(np.array([0.0, 0.0, 2.0, 0.0])) == pytest.approx(1.0)
    assert normalized_gini(np.ones(4)) == pytest.approx(0.0)
    assert math.isnan(normalized_entropy(np.zeros(3))) and math.isnan(normalized_gini(np.zeros(3)))
    s = layer_stats(np.array([0.1, np.nan, 0.5, -0.2]), layer=3, min_drop=0.2)
    assert s.top_head == 2 and s.second_head == 0 and s.margin == pytest.approx(0.4)
    assert s.share == pytest.approx(0.5 / 0.6) and s.ci_separated is None and s.is_deposit


def test_report_round_trip_and_summary():
    toks, labels, pm = fraction_data(n=60)
    r = ablate_heads(hand_built([1.0, 0.0, 0.0, 0.0]), toks, labels, pad_mask=pm, n_bootstrap=100)
    rep = find_deposits(r)
    back = DepositReport.from_dict(json.loads(json.dumps(rep.to_dict(), allow_nan=False)))
    assert back == rep
    assert "YES" in rep.summary() and "baseline 1.0000" in rep.summary()


# ------------------------------------------------------------------------------------------------
# dynamics
# ------------------------------------------------------------------------------------------------
def held_out(n: int = 40, seed: int = 5) -> Batch:
    """The fake trainer's held-out split."""
    return Batch(*fraction_data(n, seed=seed))


def tiny_cfg() -> ModelConfig:
    return ModelConfig(
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_mlp=32,
        n_ctx=8,
        d_vocab=6,
        n_classes=2,
        dropout=0.2,
        attn_dropout=0.1,
        attn_backend="sdpa",
        init_std=0.2,
    )


def train(
    run_dir, callback: DepositDynamics | None, steps: int = 7, ignore_index: int | None = None
):
    """A small manual loop that calls the callback the way the Trainer does; dropout draws on
    the global RNG, so any RNG use by the callback would change the weights."""
    torch.manual_seed(0)
    model = HookedPETransformer(tiny_cfg())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    toks, labels, pm = fraction_data(64, seed=1)
    trainer = SimpleNamespace(
        model=model,
        test=held_out(),
        train_cfg=SimpleNamespace(ignore_index=ignore_index),
        step=0,
        run_dir=run_dir,
    )
    if callback is not None:
        callback.on_train_start(trainer)
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randperm(64)[:16]
        loss = F.cross_entropy(model(toks[idx], pm[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        trainer.step = step
        if callback is not None:
            callback.on_step(trainer, step, loss.item())
            assert model.training and all(m.training for m in model.modules())
    if callback is not None:
        callback.on_train_end(trainer)
    return model, trainer, torch.get_rng_state()


def test_dynamics_records_and_does_not_change_training(tmp_path):
    plain, _, rng_plain = train(None, None)
    cb = DepositDynamics(every=3, layers=[0, 1], n_probe=24)
    watched, trainer, rng_watched = train(tmp_path, cb)
    for (name, a), (_, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(rng_plain, rng_watched)

    assert [(r["step"], r["layer"]) for r in cb.records] == [
        (s, lay) for s in (0, 3, 6, 7) for lay in (0, 1)
    ]
    assert load_dynamics(tmp_path / "deposit_dynamics.jsonl") == cb.records
    assert load_dynamics(tmp_path) == cb.records
    # The last record is the sweep of the final model on the first 24 held-out examples.
    probe = held_out()[:24]
    want = ablate_heads(
        watched, probe.tokens, probe.labels, pad_mask=probe.pad_mask, layers=[1], n_bootstrap=0
    )
    last = cb.records[-1]
    np.testing.assert_allclose(last["drops"], want.drops[1], atol=1e-12)
    assert last["baseline"] == want.baseline
    d = sorted(last["drops"], reverse=True)
    assert last["margin"] == pytest.approx(d[0] - d[1]) and last["top_drop"] == pytest.approx(d[0])
    a = dynamics_arrays(cb.records, layer=0)
    assert a["steps"].tolist() == [0, 3, 6, 7] and a["drops"].shape == (4, 4)


def test_dynamics_probe_is_what_the_ablation_probe_evaluates():
    """The held-out split without the class the loss ignores (Run.examples), not fresh samples."""
    cb = DepositDynamics(every=3, layers=[0], n_probe=12)
    model, _, _ = train(None, cb, ignore_index=1)
    test = held_out()
    kept = test[test.labels != 1][:12]
    assert torch.equal(cb.probe.tokens, kept.tokens) and (cb.probe.labels == 0).all()
    want = ablate_heads(
        model, kept.tokens, kept.labels, pad_mask=kept.pad_mask, layers=[0], n_bootstrap=0
    )
    np.testing.assert_allclose(cb.records[-1]["drops"], want.drops[0], atol=1e-12)


def test_dynamics_in_memory_without_run_dir():
    cb = DepositDynamics(every=2, layers=[1], n_probe=8, at_start=False, at_end=False)
    train(None, cb, steps=5)
    assert [r["step"] for r in cb.records] == [2, 4]


def test_dynamics_resume_drops_later_records(tmp_path):
    cb = DepositDynamics(every=3, layers=[0], n_probe=8)
    train(tmp_path, cb)
    path = tmp_path / "deposit_dynamics.jsonl"
    assert [r["step"] for r in load_dynamics(path)] == [0, 3, 6, 7]
    resumed = DepositDynamics(every=3, layers=[0], n_probe=8)
    resumed.on_train_start(SimpleNamespace(model=None, step=3, run_dir=tmp_path))
    assert [r["step"] for r in load_dynamics(path)] == [0, 3]
    assert [r["step"] for r in resumed.records] == [0, 3]
    # a torn last line (crash mid-write) is skipped when reading
    with open(path, "a") as f:
        f.write('{"step": 6, "lay')
    assert [r["step"] for r in load_dynamics(path)] == [0, 3]


def test_dynamics_validates_every():
    with pytest.raises(ValueError):
        DepositDynamics(every=0)


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------
def test_plots_write_pngs(tmp_path):
    toks, labels, pm = fraction_data(n=40)
    r = ablate_heads(hand_built([1.0, 0.0, 0.0, 0.0]), toks, labels, pad_mask=pm, n_bootstrap=0)
    fig = plot_drop_heatmap(r, tmp_path / "heat.png", deposits=[(0, 0)])
    assert fig.axes and (tmp_path / "heat.png").read_bytes()[:4] == b"\x89PNG"
    plot_layer_lines(r, tmp_path / "lines.png")
    plot_layer_lines(r, tmp_path / "lines_sep.png", separate=True)
    records = [
        {
            "step": s,
            "layer": 0,
            "metric": "accuracy",
            "baseline": 0.5 + s / 100,
            "values": [0.5] * 4,
            "drops": [s / 100, 0.01, 0.0, -0.01],
            "margin": s / 100 - 0.01,
            "share": 0.9,
            "top_head": 0,
        }
        for s in (0, 10, 20)
    ]
    (tmp_path / "deposit_dynamics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))
    plot_dynamics(tmp_path, layer=0, path=tmp_path / "dyn.png")
    for name in ("lines.png", "lines_sep.png", "dyn.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"

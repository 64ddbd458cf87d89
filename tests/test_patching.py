"""probes.patch against TransformerLens' own per-cell patching loop, on the same model and data."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from conftest import tiny_model
from transformer_lens import patching as tlp

from pe_interp import HookedPETransformer, ModelConfig
from probes.patching.sweep import (
    PatchResult,
    bootstrap_ratio_ci,
    cell_layout,
    normalized_logit_diff_metric,
    patch,
)

N, POS, VOCAB, CLASSES = 5, 8, 30, 4
TOL = 1e-5


def make_model(encoding="rope", **kw) -> HookedPETransformer:
    """The tiny model at this file's vocabulary and classes, init_std 0.4, seed 3, in float64."""
    cfg = dict(d_vocab=VOCAB, n_classes=CLASSES, init_std=0.4, seed=3)
    return tiny_model(encoding, double=True, **{**cfg, **kw})


def make_pairs(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 8, 6, 5, 7])
    pad = torch.arange(POS)[None] < lengths[:, None]
    clean = torch.randint(1, VOCAB, (N, POS), generator=g) * pad
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randint(1, VOCAB, (N,), generator=g)
    corrupt[:, 3] = torch.randint(1, VOCAB, (N,), generator=g)
    cl = torch.randint(0, CLASSES, (N,), generator=g)
    co = (cl + 1 + torch.randint(0, CLASSES - 1, (N,), generator=g)) % CLASSES
    return clean, corrupt, pad, cl, co


def tl_run(fn, model, clean, corrupt, metric, direction="clean_to_corrupt"):
    """TransformerLens' patching loop (its forwards get no pad_mask; the pads are PAD_ID)."""
    src, recv = (clean, corrupt) if direction == "clean_to_corrupt" else (corrupt, clean)
    with torch.no_grad():
        _, cache = model.run_with_cache(src)
    with contextlib.redirect_stderr(io.StringIO()):  # tqdm
        return fn(model, recv, cache, metric)


def tl_metric(model, clean, corrupt, cl, co):
    with torch.no_grad():
        return normalized_logit_diff_metric(model(clean), model(corrupt), cl, co)


@pytest.fixture(scope="module")
def rope_setup():
    model = make_model()
    clean, corrupt, pad, cl, co = make_pairs()
    return model, clean, corrupt, pad, cl, co, tl_metric(model, clean, corrupt, cl, co)


CASES = [
    ("z", False, tlp.get_act_patch_attn_head_out_all_pos),
    ("z", True, tlp.get_act_patch_attn_head_out_by_pos),
    ("q", False, tlp.get_act_patch_attn_head_q_all_pos),
    ("k", False, tlp.get_act_patch_attn_head_k_all_pos),
    ("v", False, tlp.get_act_patch_attn_head_v_all_pos),
    ("q", True, tlp.get_act_patch_attn_head_q_by_pos),
    ("v", True, tlp.get_act_patch_attn_head_v_by_pos),
    ("pattern", False, tlp.get_act_patch_attn_head_pattern_all_pos),
    ("pattern", True, tlp.get_act_patch_attn_head_pattern_by_pos),
    ("resid_pre", True, tlp.get_act_patch_resid_pre),
    ("attn_out", True, tlp.get_act_patch_attn_out),
    ("mlp_out", True, tlp.get_act_patch_mlp_out),
]


@pytest.mark.parametrize(
    "site,by_pos,fn", CASES, ids=[f"{s}-{'pos' if b else 'all'}" for s, b, _ in CASES]
)
def test_matches_transformer_lens(rope_setup, site, by_pos, fn):
    model, clean, corrupt, pad, cl, co, metric = rope_setup
    ref = tl_run(fn, model, clean, corrupt, metric)
    res = patch(
        model,
        clean,
        corrupt,
        site=site,
        by_position=by_pos,
        clean_labels=cl,
        corrupt_labels=co,
        pad_mask=pad,
        batch_size=7,
        n_bootstrap=20,
    )
    assert res.values.shape == ref.shape
    torch.testing.assert_close(res.values, ref.to(res.values.dtype), atol=TOL, rtol=0)
    assert res.values.abs().max() > 1e-3  # the comparison is not vacuous
    # per-example values average to the values; CIs bracket sensibly
    torch.testing.assert_close(res.per_example.mean(-1), res.values, atol=1e-12, rtol=0)
    assert res.per_example.shape == (*ref.shape, N)
    # the CIs are of these cells (not another axis order): each holds its own value, and has a
    # width wherever the pairs disagree
    inside = (res.ci_low <= res.values + 1e-9) & (res.values <= res.ci_high + 1e-9)
    assert inside.all(), f"{int((~inside).sum())} cells outside their own CI"
    spread = res.per_example.std(-1) > 1e-9
    assert ((res.ci_high - res.ci_low)[spread] > 0).all() and spread.any()


@pytest.mark.parametrize(
    "kw",
    [
        dict(encoding="alibi"),
        dict(encoding="t5"),
        dict(encoding="sinusoidal"),
        dict(encoding="sinusoidal+rope", kv_source="embed", mask_padding=False),
        dict(encoding="rope", attention_dir="causal", normalization_type="RMS"),
    ],
    ids=["alibi", "t5", "sinusoidal", "authors-rope", "causal-rms"],
)
def test_encodings_match_transformer_lens(kw):
    model = make_model(**kw)
    clean, corrupt, pad, cl, co = make_pairs(1)
    metric = tl_metric(model, clean, corrupt, cl, co)
    for site, fn in (
        ("z", tlp.get_act_patch_attn_head_out_all_pos),
        ("resid_pre", tlp.get_act_patch_resid_pre),
    ):
        ref = tl_run(fn, model, clean, corrupt, metric)
        res = patch(
            model,
            clean,
            corrupt,
            site=site,
            clean_labels=cl,
            corrupt_labels=co,
            n_bootstrap=0,
            pad_mask=None if not model.cfg.mask_padding else pad,
        )
        torch.testing.assert_close(res.values, ref.to(res.values.dtype), atol=TOL, rtol=0)
        assert res.ci_low is None


def test_reverse_direction_matches_tl_noising(rope_setup):
    model, clean, corrupt, pad, cl, co, metric = rope_setup
    ref = tl_run(
        tlp.get_act_patch_attn_head_out_all_pos, model, clean, corrupt, metric, "corrupt_to_clean"
    )
    res = patch(
        model,
        clean,
        corrupt,
        site="z",
        direction="corrupt_to_clean",
        clean_labels=cl,
        corrupt_labels=co,
        n_bootstrap=0,
    )
    torch.testing.assert_close(res.values, ref.to(res.values.dtype), atol=TOL, rtol=0)
    assert res.direction == "corrupt_to_clean"


def test_custom_metrics(rope_setup):
    model, clean, corrupt, pad, cl, co, _ = rope_setup

    def scalar(logits):  # TL convention: a scalar over the batch
        return logits.log_softmax(-1).gather(-1, cl[:, None]).mean()

    ref = tl_run(tlp.get_act_patch_attn_head_out_by_pos, model, clean, corrupt, scalar)
    res = patch(model, clean, corrupt, site="z", by_position=True, metric=scalar, batch_size=3)
    torch.testing.assert_close(res.values, ref.to(res.values.dtype), atol=TOL, rtol=0)
    assert res.per_example is None and res.ci_low is None

    def per_example(logits):
        return logits.log_softmax(-1).gather(-1, cl[:, None]).squeeze(-1)

    res2 = patch(
        model, clean, corrupt, site="z", by_position=True, metric=per_example, n_bootstrap=50
    )
    torch.testing.assert_close(res2.values, ref.to(res2.values.dtype), atol=TOL, rtol=0)
    assert res2.per_example.shape == (*ref.shape, N)
    with torch.no_grad():
        assert res2.clean_value == pytest.approx(float(per_example(model(clean)).mean()))


def test_batching_and_layers_do_not_change_values(rope_setup):
    model, clean, corrupt, pad, cl, co, _ = rope_setup
    kw = dict(
        site="z", by_position=True, clean_labels=cl, corrupt_labels=co, pad_mask=pad, n_bootstrap=0
    )
    a = patch(model, clean, corrupt, batch_size=1, **kw)
    b = patch(model, clean, corrupt, batch_size=1000, **kw)
    c = patch(model, clean, corrupt, layers=[1], **kw)
    torch.testing.assert_close(a.values, b.values, atol=1e-10, rtol=0)
    torch.testing.assert_close(c.values[0], a.values[1], atol=1e-10, rtol=0)
    assert c.layers == (1,) and c.shape == (1, POS, 2)


def test_sanity_values(rope_setup):
    model, clean, corrupt, pad, cl, co, _ = rope_setup
    # replacing the whole residual stream before layer 0 reproduces the clean run exactly
    r = patch(
        model,
        clean,
        corrupt,
        site="resid_pre",
        by_position=False,
        clean_labels=cl,
        corrupt_labels=co,
        n_bootstrap=100,
    )
    assert r.shape == (2,)
    assert float(r.values[0]) == pytest.approx(1.0, abs=1e-9)
    assert float(r.ci_low[0]) == pytest.approx(1.0, abs=1e-9) and float(
        r.ci_high[0]
    ) == pytest.approx(1.0, abs=1e-9)
    # patching at padding positions changes nothing (keys masked, pads not pooled)
    z = patch(
        model,
        clean,
        corrupt,
        site="z",
        by_position=True,
        clean_labels=cl,
        corrupt_labels=co,
        pad_mask=pad,
        n_bootstrap=0,
    )
    pads = ~pad
    assert z.per_example.permute(0, 2, 1, 3)[:, :, pads.T].abs().max() < 1e-12  # [L, H, pos, ex]
    # the default metric's anchors
    assert r.clean_value == 1.0 and r.corrupt_value == 0.0


def test_bootstrap_ratio_ci_known():
    numer = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 0.0, 2.0]])
    denom = torch.tensor([2.0, 2.0, 2.0, 2.0])
    lo, hi = bootstrap_ratio_ci(numer, denom, 500, seed=0)
    assert lo[0] == pytest.approx(0.5) and hi[0] == pytest.approx(0.5)  # constant ratio
    assert lo[1] < 0.5 < hi[1]
    lo2, hi2 = bootstrap_ratio_ci(numer, denom, 500, seed=0)
    assert torch.equal(lo, lo2)  # seeded


def test_cell_layout_shapes():
    m, shape, axes = cell_layout("pattern", True, 5, 3)
    assert m.shape == (15, 1, 3, 5, 1) and shape == (3, 5) and axes == ("layer", "head", "dest_pos")
    assert m.sum() == 15
    m, shape, axes = cell_layout("z", False, 5, 3)
    assert m.shape == (3, 1, 1, 3, 1) and axes == ("layer", "head")


def test_result_serialises_and_errors(rope_setup):
    model, clean, corrupt, pad, cl, co, _ = rope_setup
    r = patch(model, clean, corrupt, site="z", clean_labels=cl, corrupt_labels=co, n_bootstrap=10)
    assert isinstance(r, PatchResult)
    d = json.loads(json.dumps(r.to_dict(per_example=True)))
    assert (
        d["shape"] == [2, 2]
        and d["axis_names"] == ["layer", "head"]
        and len(d["per_example"][0][0]) == N
    )
    cell, value = r.top(1)[0]
    assert value == pytest.approx(float(r.values.abs().max()), abs=1e-12) or value == pytest.approx(
        -float(r.values.abs().max()), abs=1e-12
    )
    assert set(cell) == {"layer", "head"}
    with pytest.raises(dataclasses_error()):
        r.site = "q"
    with pytest.raises(ValueError, match="site"):
        patch(model, clean, corrupt, site="nope", clean_labels=cl, corrupt_labels=co)
    with pytest.raises(ValueError, match="labels"):
        patch(model, clean, corrupt)
    with pytest.raises(ValueError, match="same shape"):
        patch(model, clean, corrupt[:, :4], clean_labels=cl, corrupt_labels=co)
    with pytest.raises(ValueError, match="same mean logit difference"):
        patch(model, clean, clean, clean_labels=cl, corrupt_labels=co)


def dataclasses_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_model_training_mode_restored(rope_setup):
    model, clean, corrupt, pad, cl, co, _ = rope_setup
    model.train()
    try:
        patch(model, clean, corrupt, site="z", clean_labels=cl, corrupt_labels=co, n_bootstrap=0)
        assert model.training
    finally:
        model.eval()


def test_views_are_offline(rope_setup, tmp_path):
    from probes.common.html import save_html
    from probes.heads.patterns import token_labels
    from probes.heads.view import attention_html
    from probes.patching.view import patching_tokens_html, plot_patching

    model, clean, corrupt, pad, cl, co, _ = rope_setup
    r = patch(
        model,
        clean,
        corrupt,
        site="z",
        by_position=True,
        clean_labels=cl,
        corrupt_labels=co,
        n_bootstrap=0,
    )
    labels = token_labels(clean[0], pad[0])
    html = patching_tokens_html(r, labels)
    assert "CircuitsVis" in html and "unpkg.com" not in html and html.count("var CircuitsVis") == 1
    one = patching_tokens_html(r, labels, head=1, layers=[0], example=2)
    assert "ColoredTokens" in one
    path = save_html(html, tmp_path / "p.html", title="t")
    assert path.read_text().startswith("<!DOCTYPE html>")
    att = attention_html(model, clean, [(0, 1), (1, 0)], example=2, pad_mask=pad)
    assert "AttentionHeads" in att and "unpkg.com" not in att
    png = plot_patching(r, tmp_path / "p.png")[0]
    assert png.stat().st_size > 1000


def test_patch_command_core(tmp_path):
    from pe_interp.commands.patch import patch_run
    from pe_interp.tasks import DistanceTask

    task = DistanceTask(d_vocab=24, max_between=3, max_side=2, max_len=8, seed=1)
    cfg = ModelConfig(
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_mlp=32,
        n_ctx=8,
        d_vocab=24,
        n_classes=task.n_classes,
        encoding="rope",
        init_std=0.4,
    )
    model = HookedPETransformer(cfg).eval()
    result, written = patch_run(
        model, task, tmp_path, site="z", by_position=True, n=6, n_bootstrap=20
    )
    data = json.loads((tmp_path / "patching.json").read_text())
    assert data["shape"] == [2, 8, 2] and data["pairs"]["n"] == 6
    assert (tmp_path / "patching_z_by_pos.json").exists()
    assert written["png"].exists() and "CircuitsVis" in written["html"].read_text()
    result2, written2 = patch_run(model, task, tmp_path, site="z", n=6, n_bootstrap=0)
    assert result2.shape == (2, 2) and "AttentionHeads" in written2["html"].read_text()


def _count_forwards(model) -> list[int]:
    """Count the forwards that reach the last block (every forward that does any work does)."""
    seen = [0]
    model.blocks[-1].register_forward_hook(lambda *a: seen.__setitem__(0, seen[0] + 1))
    return seen


def test_patch_refuses_pairs_that_change_nothing_before_any_patching():
    """Issue 46: two forwards tell that clean and corrupt runs give the same logit difference, so
    the refusal costs at most three forwards, not a sweep (counted by a hook, not a clock)."""
    model = make_model()
    clean, _, pad, cl, co = make_pairs()
    seen = _count_forwards(model)
    with pytest.raises(ValueError, match=r"same mean logit difference \(0\)"):
        patch(model, clean, clean.clone(), clean_labels=cl, corrupt_labels=co, pad_mask=pad)
    assert 1 <= seen[0] <= 3
    seen[0] = 0
    with pytest.raises(ValueError, match="every pair has the same clean and corrupt label"):
        patch(model, clean, clean.clone(), clean_labels=cl, corrupt_labels=cl, pad_mask=pad)
    assert seen[0] == 0

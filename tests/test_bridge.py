"""Probes on a TransformerLens 4 bridge (issue 38): the four architectures of the paper's encodings,
built from configs, saved, booted offline, and ablated exactly, against a naive loop written here on
the bridge itself (its own ``run_with_hooks``, the answer read at the last real token)."""

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
from probes import ablate_heads, ablate_heads_naive

V, PAD = 30, 0
ANSWERS = [26, 27, 28, 29]  # class c is token ANSWERS[c]
SHAPE = {
    "n_layers": 2,
    "d_model": 24,
    "n_heads": 3,
    "d_mlp": 40,
    "n_ctx": 16,
    "d_vocab": V,
    "pad_id": PAD,
}


@pytest.fixture(scope="module", params=ARCHS)
def bridged(request, tmp_path_factory):
    arch = request.param
    hf = build_hf_model(arch, seed=3, **SHAPE)
    out = save_model_dir(hf, word_tokenizer(V, PAD), tmp_path_factory.mktemp(arch) / "model")
    return arch, hf, boot_bridge(out)


def _examples(n: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 13, (n,), generator=g)
    tokens = torch.randint(1, 26, (n, 12), generator=g)
    mask = torch.arange(12)[None] < lengths[:, None]
    tokens[~mask] = PAD
    return tokens, mask, torch.randint(0, len(ANSWERS), (n,), generator=g)


def _answer_logits(bridge, tokens, mask, hooks=()):
    with torch.no_grad():
        logits = bridge.run_with_hooks(tokens, fwd_hooks=list(hooks), attention_mask=mask.long())
    last = mask.sum(1) - 1
    return logits[torch.arange(len(tokens)), last][:, ANSWERS]


def test_the_bridge_reads_the_hugging_face_model(bridged):
    arch, hf, bridge = bridged
    tokens, mask, _ = _examples()
    model = BridgedModel(bridge, answers=ANSWERS)
    with torch.no_grad():
        ours = model(tokens, mask)
        ref = hf(tokens, attention_mask=mask.long()).logits
    want = ref[torch.arange(len(tokens)), mask.sum(1) - 1][:, ANSWERS]
    assert torch.allclose(ours, want, atol=1e-5), (ours - want).abs().max()
    assert model.cfg.encoding_kind == (
        "multiplicative" if arch in ("gpt-neox", "llama") else "additive"
    )


def test_resume_at_a_layer_is_exact_where_the_bridge_claims_it(bridged):
    arch, _, bridge = bridged
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, _ = _examples()
    with torch.no_grad():
        full, cache = bridge.run_with_cache(tokens, attention_mask=mask.long())
        again = bridge(
            cache["blocks.1.hook_resid_pre"], start_at_layer=1, attention_mask=mask.long()
        )
    gap = float((full - again).abs()[mask].max())
    assert model.can_resume == (arch != "bloom")
    if model.can_resume:
        assert gap <= 1e-5
        want = model(tokens, mask)
        got = model.resume(tokens, 1, cache["blocks.1.hook_resid_pre"], mask)
        assert torch.allclose(got, want, atol=1e-5)
    else:  # BLOOM: the bridge drops ALiBi when it starts at a layer, so the sweep never resumes there
        assert gap > 1e-4
        with pytest.raises(ValueError, match="cannot restart at a layer exactly"):
            model.resume(tokens, 1, cache["blocks.1.hook_resid_pre"], mask)


@pytest.mark.parametrize("metric", ["accuracy", "logit"])
def test_exact_ablation_on_a_bridge_equals_a_naive_hook_z_loop(bridged, metric):
    arch, _, bridge = bridged
    tokens, mask, labels = _examples()
    model = BridgedModel(bridge, answers=ANSWERS)
    got = ablate_heads(
        model,
        tokens,
        labels,
        pad_mask=mask,
        metric=metric,
        n_bootstrap=0,
        batch_size=40,
        per_example=True,
    )
    for layer in range(2):
        for h in range(3):

            def zero(z, hook, h=h):
                z = z.clone()
                z[:, :, h] = 0.0
                return z

            logits = _answer_logits(bridge, tokens, mask, [(f"blocks.{layer}.attn.hook_z", zero)])
            want = (
                (logits.argmax(1) == labels).double()
                if metric == "accuracy"
                else logits.gather(1, labels[:, None])[:, 0].double()
            )
            np.testing.assert_allclose(got.per_example[layer, h], want.numpy(), atol=1e-6)
    base = _answer_logits(bridge, tokens, mask)
    want = (
        (base.argmax(1) == labels).double().mean()
        if metric == "accuracy"
        else base.gather(1, labels[:, None]).double().mean()
    )
    assert abs(got.baseline - float(want)) <= 1e-6


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_mean_and_resample_on_a_bridge_equal_the_slow_reference(bridged, method):
    _, _, bridge = bridged
    tokens, mask, labels = _examples(seed=1)
    model = BridgedModel(bridge, answers=ANSWERS)
    fast = ablate_heads(
        model,
        tokens,
        labels,
        pad_mask=mask,
        method=method,
        metric="logit",
        n_bootstrap=0,
        batch_size=32,
    )
    slow = ablate_heads_naive(
        model, tokens, labels, pad_mask=mask, method=method, metric="logit", n_bootstrap=0
    )
    np.testing.assert_allclose(fast.values, slow.values, atol=1e-6)
    assert fast.meta["encoding"] == model.cfg.encoding_name


def test_head_patching_on_a_bridge_equals_transformer_lens_own_patching(bridged):
    from transformer_lens import patching

    from probes import normalized_logit_diff_metric, patch

    _, _, bridge = bridged
    model = BridgedModel(bridge, answers=ANSWERS)
    g = torch.Generator().manual_seed(5)
    clean, corrupt = (
        torch.randint(1, 26, (10, 9), generator=g),
        torch.randint(1, 26, (10, 9), generator=g),
    )
    good = torch.randint(0, 4, (10,), generator=g)
    bad = (good + 1) % 4
    ours = patch(
        model,
        clean,
        corrupt,
        clean_labels=good,
        corrupt_labels=bad,
        site="z",
        by_position=False,
        n_bootstrap=0,
    )
    with torch.no_grad():
        clean_logits, cache = bridge.run_with_cache(clean)
        corrupt_logits = bridge(corrupt)

    def last(logits):
        return logits[:, -1][:, ANSWERS]

    metric = normalized_logit_diff_metric(last(clean_logits), last(corrupt_logits), good, bad)
    theirs = patching.get_act_patch_attn_head_out_all_pos(
        bridge, corrupt, cache, lambda lg: metric(last(lg))
    )
    assert ours.values.shape == theirs.shape == (2, 3)
    assert torch.allclose(ours.values, theirs.to(ours.values.dtype), atol=1e-5), (
        (ours.values - theirs).abs().max()
    )


def test_a_bridge_refuses_what_it_cannot_read(bridged):
    _, _, bridge = bridged
    model = BridgedModel(bridge, answers=ANSWERS)
    tokens, mask, labels = _examples()
    left = mask.flip(1)
    with pytest.raises(ValueError, match="real token after a pad; pad on the right"):
        ablate_heads(model, tokens.flip(1), labels, pad_mask=left)
    with pytest.raises(ValueError, match="is outside the vocabulary"):
        ablate_heads(model, tokens + V, labels, pad_mask=mask)
    with pytest.raises(ValueError, match="exceeds n_ctx="):  # BLOOM's ALiBi: its config's n_ctx
        model(torch.ones(2, model.cfg.n_ctx + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        ablate_heads(model, tokens, labels + len(ANSWERS), pad_mask=mask)
    with pytest.raises(ValueError, match="answers must be distinct token ids"):
        BridgedModel(bridge, answers=[1, 1])
    with pytest.raises(
        ValueError,
        match="ablate_heads: model must be a pe_interp HookedPETransformer, a TransformerBridge or "
        "a BridgedModel, got Linear, which lacks cfg",
    ):
        ablate_heads(torch.nn.Linear(2, 2), tokens, labels)
    # a raw bridge is wrapped at the door: its classes are the vocabulary, a label a token id
    raw = ablate_heads(bridge, tokens, labels, pad_mask=mask, n_bootstrap=0)
    assert raw.n_examples == len(tokens) and np.isfinite(raw.values).all()


# ------------------------------------------------------------------------------------------------
# A saved model directory is a run: pe-interp ablate DIR --task distance
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # smoke's task 1: 32 input ids, 6 classes -> answers 32..37; inputs up to 16 tokens
    shape = {
        "n_layers": 2,
        "d_model": 16,
        "n_heads": 2,
        "d_mlp": 32,
        "n_ctx": 16,
        "d_vocab": 38,
        "pad_id": 0,
    }
    hf = build_hf_model("gpt-neox", seed=1, **shape)
    return save_model_dir(hf, word_tokenizer(38, 0), tmp_path_factory.mktemp("neox") / "model")


def test_ablate_reads_a_saved_model_directory_with_task(model_dir, tmp_path, capsys):
    import shutil

    from pe_interp.cli import main
    from pe_interp.runs.model_dirs import load_model_dir
    from probes import AblationResult

    run = tmp_path / "m"
    shutil.copytree(model_dir, run)
    argv = [
        "ablate",
        str(run),
        "--task",
        "distance",
        "--preset",
        "smoke",
        "--n",
        "24",
        "--n-bootstrap",
        "40",
        "--no-figures",
        "--no-progress",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "gpt-neox: partial rotary" in out
    saved = AblationResult.load(run / "ablation.json")
    loaded = load_model_dir(run, "distance", "smoke")
    test = loaded.examples("test", 24)
    again = ablate_heads(
        loaded.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=40
    )
    np.testing.assert_allclose(saved.values, again.values, atol=1e-9)
    assert saved.n_examples == 24 and saved.values.shape == (2, 2)


def test_routes_reads_a_saved_model_directory_with_task(model_dir, tmp_path, capsys):
    """Route shares of GPT-NeoX's partial rotary heads through the bridge (tests/test_bridge_routes.py
    holds them to the Hugging Face model and a naive loop)."""
    import shutil

    from pe_interp.cli import main
    from probes import RouteShares

    run = tmp_path / "m"
    shutil.copytree(model_dir, run)
    code = main(
        [
            "routes",
            str(run),
            "--task",
            "distance",
            "--preset",
            "smoke",
            "--n",
            "32",
            "--n-bootstrap",
            "50",
        ]
    )
    assert code in (0, 3)  # 3: the intervals cannot decide
    r = RouteShares.load(run / "routes.json")
    assert r.routes.all() and r.embed is None and r.n_examples == 32
    assert "positional deposit" in capsys.readouterr().out


def test_circuit_reads_a_saved_model_directory_with_task(model_dir, tmp_path, capsys):
    """The whole circuit command on a bridge: family attributions per span, the faithful circuit on
    held-out pairs, exact path patching into the top head."""
    import shutil

    from pe_interp.cli import main
    from probes import Circuit

    run = tmp_path / "m"
    shutil.copytree(model_dir, run)
    argv = [
        "circuit",
        str(run),
        "--task",
        "distance",
        "--preset",
        "smoke",
        "--n",
        "12",
        "--faithful",
        "0.8",
    ]
    assert main(argv) == 0
    assert "the smallest circuit with faithfulness >= 0.8" in capsys.readouterr().out
    c = Circuit.load(run / "circuit.json")
    assert c.faithfulness["kept"] >= 0.8 and 0 < len(c.edges) <= c.total_edges
    route = c.meta["route"]
    assert set(route["exact"]) == {"position", "content"}
    if route["head"].startswith(
        "L0"
    ):  # layer-0 logit terms, through the bridge (tests/test_bridge_decomposition.py)
        assert "content-content" in route["layer0"]["variance_share"]
    else:
        assert route["layer0"] is None
    assert c.meta["encoding"].startswith("gpt-neox: partial rotary")


@pytest.mark.parametrize("argv,pattern", [
    (["ablate", "{d}"], r"a saved Hugging Face model, not a pe-interp run: say which task to probe it on with --task"),
    (["ablate", "{d}", "--task", "distance", "--preset", "quick"],
     r"the model's vocabulary \(38\) is too small for task 'distance' at preset 'quick': it needs 128 input ids and 30"),
    (["ablate", "{d}", "--task", "sorting", "--preset", "smoke"], r"task must be one of"),
    (["ablate", "{d}@4", "--task", "distance", "--preset", "smoke"], r"a saved Hugging Face model has no snapshots"),
    (["circuit", "{d}"], r"say which task to probe it on with --task"),
    (["generalize", "{d}"], r"this command reads pe-interp runs only"),
    (["ablate", "{d}", "--task", "distance", "--preset", "smoke", "--revision", "step1"],
     r"--revision is for a model on the Hugging Face hub"),
    (["ablate", "owner-x/no-such-model"], r"run directory not found"),
    (["ablate", "owner-x/no-such-model", "--task", "distance"],
     r"owner-x/no-such-model@main: no local directory of that name, and the Hugging Face hub is (off|not reachable)"),
    (["patch", "owner-x/no-such-model", "--task", "distance", "--revision", "step1000"],
     r"owner-x/no-such-model@step1000: no local directory of that name"),
    # show reads a model directory (issue 54; tests/test_bad_inputs_models.py); report points to it
    (["report", "{d}"], r"a saved Hugging Face model, not a pe-interp run"),
])  # fmt: skip
def test_a_model_directory_that_cannot_be_read_says_why_in_one_line(
    model_dir, argv, pattern, capsys
):
    from bad_input_env import expect_cli_refusal

    expect_cli_refusal([a.format(d=model_dir) for a in argv], pattern, capsys)
    assert not (model_dir / "ablation.json").exists()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("draw", range(2))
def test_exact_ablation_equals_the_naive_loop_at_drawn_sizes(arch, draw, tmp_path):
    """Shapes this file does not otherwise build: drawn per architecture and draw (seeded)."""
    g = torch.Generator().manual_seed(1000 * draw + ARCHS.index(arch))
    n_layers, n_heads, d_head = (
        int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 4), (2, 6), (2, 7))
    )
    d_head *= 2  # rotary halves need an even head size
    shape = {
        "n_layers": n_layers,
        "d_model": n_heads * d_head,
        "n_heads": n_heads,
        "d_mlp": 24,
        "n_ctx": 16,
        "d_vocab": V,
        "pad_id": PAD,
    }
    out = save_model_dir(
        build_hf_model(arch, seed=draw, **shape), word_tokenizer(V, PAD), tmp_path / "m"
    )
    model = BridgedModel(boot_bridge(out), answers=ANSWERS)
    tokens, mask, labels = _examples(seed=draw)
    got = ablate_heads(
        model, tokens, labels, pad_mask=mask, metric="logit", n_bootstrap=0, batch_size=64
    )
    naive = ablate_heads_naive(model, tokens, labels, pad_mask=mask, metric="logit", n_bootstrap=0)
    assert got.values.shape == (n_layers, n_heads)
    np.testing.assert_allclose(got.values, naive.values, atol=1e-6)

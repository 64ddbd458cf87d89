"""HookedPETransformer: backends agree (forward and every gradient), padding is invisible when
masked, NoPE is permutation invariant, inputs are validated, and the TransformerLens machinery
(cache, hooks, patching, resuming from a layer) works on it."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from transformer_lens import ActivationCache
from transformer_lens import patching as tl_patching

from pe_interp import HookedPETransformer

LENGTHS = [10, 7, 4, 10]  # right-padded rows for a [4, 10] batch


def labels_for(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(seed))


def spy_backends(model: HookedPETransformer) -> list[tuple[int, str]]:
    """Record (layer, 'eager'|'sdpa') each time an attention layer runs a backend."""
    calls: list[tuple[int, str]] = []
    for block in model.blocks:
        attn = block.attn
        for name in ("_eager", "_sdpa"):
            original = getattr(attn, name)

            def wrapped(*args, _orig=original, _name=name, _layer=attn.layer):
                calls.append((_layer, _name[1:]))
                return _orig(*args)

            setattr(attn, name, wrapped)
    return calls


# ---- backends -----------------------------------------------------------------------------------
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("attention_dir", ["bidirectional", "causal"])
def test_eager_and_sdpa_agree(make_config, tokens_fn, encoding, attention_dir, padded):
    """Logits and every parameter gradient agree to 1e-5 in float32 (init_std 0.3 so attention
    is far from uniform; the largest gradients are of order 1)."""
    tokens = tokens_fn(4, 10, lengths=LENGTHS if padded else None)
    labels = labels_for(4)
    results = {}
    for backend in ("eager", "sdpa"):
        cfg = make_config(
            encoding=encoding, attention_dir=attention_dir, attn_backend=backend, init_std=0.3
        )
        model = HookedPETransformer(cfg).train()  # dropout is 0: train mode must be deterministic
        calls = spy_backends(model)
        logits = model(tokens)
        assert {b for _, b in calls} == {backend}
        F.cross_entropy(logits, labels).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        results[backend] = (logits.detach(), grads)
    (l_e, g_e), (l_s, g_s) = results["eager"], results["sdpa"]
    torch.testing.assert_close(l_s, l_e, atol=1e-5, rtol=0)
    assert g_e.keys() == g_s.keys()
    assert all(g is not None for g in g_e.values()), [n for n, g in g_e.items() if g is None]
    for name in g_e:
        torch.testing.assert_close(g_s[name], g_e[name], atol=1e-5, rtol=0, msg=name)
    assert max(g.abs().max().item() for g in g_e.values()) > 0.1  # gradients are not all tiny


@pytest.mark.parametrize("attention_dir", ["bidirectional", "causal"])
def test_backends_agree_in_float64(make_config, tokens_fn, attention_dir):
    tokens = tokens_fn(4, 10, lengths=LENGTHS)
    outs = {}
    for backend in ("eager", "sdpa"):
        cfg = make_config(
            encoding="sinusoidal+t5+rope",
            attention_dir=attention_dir,
            attn_backend=backend,
            init_std=0.3,
        )
        model = HookedPETransformer(cfg).double()
        logits = model(tokens)
        logits.logsumexp(-1).sum().backward()
        outs[backend] = (
            logits,
            model.encoding.parts[1].rel_bias.grad,
            model.blocks[0].attn.W_Q.grad,
        )
    for e, s in zip(outs["eager"], outs["sdpa"]):
        assert e.dtype == torch.float64
        torch.testing.assert_close(s, e, atol=1e-12, rtol=1e-10)


def test_auto_equals_eager_on_cpu(make_config, tokens_fn, encoding):
    tokens = tokens_fn(4, 10, lengths=LENGTHS)
    eager = HookedPETransformer(make_config(encoding=encoding, attn_backend="eager", init_std=0.3))
    auto = HookedPETransformer(make_config(encoding=encoding, attn_backend="auto", init_std=0.3))
    ctx = auto.context(tokens, tokens != 0, None)
    assert [b.attn.backend(ctx) for b in auto.blocks] == ["sdpa", "sdpa"]  # no triton on CPU
    torch.testing.assert_close(auto(tokens), eager(tokens), atol=1e-5, rtol=0)


def test_hooking_pattern_forces_eager_on_that_layer(make_model, tokens_fn):
    model = make_model(encoding="t5", attn_backend="sdpa", init_std=0.3)
    reference = make_model(encoding="t5", attn_backend="eager", init_std=0.3)
    tokens = tokens_fn(4, 10, lengths=LENGTHS)
    ctx = model.context(tokens, tokens != 0, None)
    calls = spy_backends(model)
    model(tokens)
    assert calls == [(0, "sdpa"), (1, "sdpa")]

    calls.clear()
    logits, cache = model.run_with_cache(
        tokens, names_filter=lambda n: n == "blocks.1.attn.hook_pattern"
    )
    assert calls == [(0, "sdpa"), (1, "eager")]
    assert list(cache.keys()) == ["blocks.1.attn.hook_pattern"]
    _, ref_cache = reference.run_with_cache(tokens)
    torch.testing.assert_close(
        cache["blocks.1.attn.hook_pattern"], ref_cache["blocks.1.attn.hook_pattern"]
    )
    torch.testing.assert_close(logits, reference(tokens), atol=1e-5, rtol=0)

    calls.clear()
    model.run_with_cache(tokens)  # caching everything: every layer eager
    assert calls == [(0, "eager"), (1, "eager")]

    noop = lambda x, hook: None  # noqa: E731
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", noop)]):
        assert [b.attn.backend(ctx) for b in model.blocks] == ["eager", "sdpa"]
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", noop)]):
        assert [b.attn.backend(ctx) for b in model.blocks] == ["sdpa", "eager"]
    with model.hooks(
        fwd_hooks=[("blocks.1.attn.hook_z", noop), ("blocks.0.attn.hook_pos_bias", noop)]
    ):
        assert [b.attn.backend(ctx) for b in model.blocks] == ["sdpa", "sdpa"]
    assert [b.attn.backend(ctx) for b in model.blocks] == ["sdpa", "sdpa"]  # hooks removed
    calls.clear()
    model(tokens)
    assert calls == [(0, "sdpa"), (1, "sdpa")]


def test_plain_torch_hook_on_pattern_is_not_silently_skipped(make_model, tokens_fn):
    """Regression (fixed): ``attention.has_hooks`` looked only at TransformerLens' ``fwd_hooks``/
    ``bwd_hooks`` lists, so a hook added with plain ``register_forward_hook`` on ``hook_pattern``
    never fired on the sdpa backend (the module docstring promises hooks never silently miss)."""
    model = make_model(encoding="rope", attn_backend="sdpa")
    seen = []
    handle = model.blocks[0].attn.hook_pattern.register_forward_hook(
        lambda m, i, o: seen.append(o.shape)
    )
    try:
        model(tokens_fn(3, 6))
    finally:
        handle.remove()
    assert seen == [(3, 2, 6, 6)]


def test_hooking_scores_changes_the_result_even_on_sdpa(make_model, tokens_fn):
    """A hook that edits scores must take effect (the layer runs eagerly, never silently sdpa)."""
    model = make_model(encoding="rope", attn_backend="sdpa", init_std=0.3)
    tokens = tokens_fn(2, 10)

    def uniform(scores, hook):
        return torch.zeros_like(scores)

    hooked = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_attn_scores", uniform)])
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", uniform)]):
        _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], torch.full((2, 2, 10, 10), 0.1))
    assert not torch.allclose(hooked, model(tokens), atol=1e-4)


# ---- padding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pooling", ["mean", "first", "last"])
@pytest.mark.parametrize("attention_dir", ["bidirectional", "causal"])
def test_appending_pads_changes_nothing_when_masked(
    make_config, tokens_fn, encoding, attention_dir, pooling
):
    cfg = make_config(encoding=encoding, attention_dir=attention_dir, pooling=pooling, init_std=0.3)
    model = HookedPETransformer(cfg).eval()
    tokens = tokens_fn(4, 8, lengths=[8, 5, 2, 8])
    base = model(tokens)
    for extra in (1, 4):
        padded = torch.cat([tokens, torch.zeros(4, extra, dtype=tokens.dtype)], dim=1)
        torch.testing.assert_close(model(padded), base, atol=1e-5, rtol=0)
        explicit = torch.cat([tokens != 0, torch.zeros(4, extra, dtype=torch.bool)], dim=1)
        torch.testing.assert_close(model(padded, pad_mask=explicit), base, atol=1e-5, rtol=0)


def test_pad_mask_argument_overrides_pad_id(make_model, tokens_fn):
    model = make_model(encoding="rope", init_std=0.3)
    tokens = tokens_fn(2, 8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 5:] = False
    trimmed = model(tokens[1:, :5])
    torch.testing.assert_close(model(tokens, pad_mask=mask)[1:], trimmed, atol=1e-5, rtol=0)
    # Token 0 treated as real when the mask says so.
    zeros_inside = tokens.clone()
    zeros_inside[0, 3] = 0
    all_real = torch.ones(2, 8, dtype=torch.bool)
    assert not torch.allclose(
        model(zeros_inside), model(zeros_inside, pad_mask=all_real), atol=1e-4
    )


@pytest.mark.parametrize("encoding", ["nope", "rope", "learned"])
def test_unmasked_pads_are_seen(make_config, tokens_fn, encoding):
    """mask_padding=False (the authors' code): pads are attended to and pooled."""
    cfg = make_config(encoding=encoding, mask_padding=False, init_std=0.3)
    model = HookedPETransformer(cfg).eval()
    tokens = tokens_fn(3, 6)
    padded = torch.cat([tokens, torch.zeros(3, 3, dtype=tokens.dtype)], dim=1)
    assert (model(padded) - model(tokens)).abs().max() > 1e-3
    # A row of all pads is legal here (nothing is masked).
    assert torch.isfinite(model(torch.zeros(2, 4, dtype=torch.long))).all()
    # And it matches a masked model given an all-true pad mask.
    masked = HookedPETransformer(cfg.replace(mask_padding=True)).eval()
    torch.testing.assert_close(
        masked(padded, pad_mask=torch.ones(3, 9, dtype=torch.bool)), model(padded)
    )


# ---- permutation invariance ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "encoding, invariant", [("nope", True), ("rope", False), ("learned", False), ("alibi", False)]
)
def test_nope_is_permutation_invariant(make_config, tokens_fn, encoding, invariant):
    cfg = make_config(
        encoding=encoding, init_std=0.3, attention_dir="bidirectional", pooling="mean"
    )
    model = HookedPETransformer(cfg).eval()
    lengths = [9, 6, 3]
    tokens = tokens_fn(3, 9, lengths=lengths)
    permuted = tokens.clone()
    gen = torch.Generator().manual_seed(4)
    for row, n in enumerate(lengths):
        permuted[row, :n] = tokens[row, torch.randperm(n, generator=gen)]
    assert not torch.equal(permuted, tokens)
    diff = (model(permuted) - model(tokens)).abs().max().item()
    if invariant:
        assert diff <= 1e-5
    else:
        assert diff > 1e-3


# ---- input validation ---------------------------------------------------------------------------
def bad_inputs():
    ok = torch.randint(1, 20, (2, 6))
    all_pad = ok.clone()
    all_pad[1] = 0
    return {
        "negative": (torch.tensor([[1, -1, 2]]), None, "vocabulary"),
        "too-large": (torch.tensor([[1, 20, 2]]), None, "vocabulary"),
        "far-too-large": (torch.tensor([[1, 10**9]]), None, "vocabulary"),
        "float": (ok.float(), None, "integer"),
        "bool": (ok > 5, None, "integer"),
        "list": ([[1, 2, 3]], None, "tensor"),
        "1d": (ok[0], None, "shape"),
        "3d": (ok[None], None, "shape"),
        "empty": (ok[:, :0], None, "shape"),
        "too-long": (torch.randint(1, 20, (2, 13)), None, "n_ctx"),
        "all-pads": (all_pad, None, "no real token"),
        "mask-all-false": (ok, torch.zeros(2, 6, dtype=torch.bool), "no real token"),
        "mask-shape": (ok, torch.ones(2, 5, dtype=torch.bool), "pad_mask"),
        "mask-dtype": (ok, torch.ones(2, 6, dtype=torch.long), "pad_mask"),
        "mask-float": (ok, torch.ones(2, 6), "pad_mask"),
        "mask-list": (ok, [[True] * 6] * 2, "pad_mask"),
    }


@pytest.mark.parametrize("case", list(bad_inputs()))
def test_bad_inputs_raise_value_error(make_model, case):
    tokens, pad_mask, words = bad_inputs()[case]
    model = make_model(encoding="learned")
    with pytest.raises(ValueError, match=words):
        model(tokens, pad_mask)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_accepted_integer_dtypes_give_the_same_logits(make_model, tokens_fn, dtype):
    """Regression (fixed; int16, uint8): check_inputs accepted them, then F.embedding raised a
    RuntimeError (only int64/int32 indices are supported); with the old ``W_E[tokens]`` a uint8
    tensor was even read as a boolean mask."""
    model = make_model(encoding="rope")
    tokens = tokens_fn(3, 6)
    torch.testing.assert_close(model(tokens.to(dtype)), model(tokens), atol=0, rtol=0)


def test_resume_arguments_are_validated(make_model, tokens_fn):
    model = make_model()
    tokens = tokens_fn(2, 6)
    with pytest.raises(ValueError, match="residual"):
        model(tokens, start_at_layer=1)
    for start, stop in [(-1, None), (3, None), (2, 1), (0, 3)]:
        with pytest.raises(ValueError, match="start_at_layer"):
            model(tokens, start_at_layer=start, stop_at_layer=stop, residual=torch.zeros(2, 6, 16))


def test_rejects_non_config():
    with pytest.raises(TypeError):
        HookedPETransformer({"d_model": 16})


# ---- TransformerLens integration ----------------------------------------------------------------
ATTN_HOOKS = ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"]


@pytest.mark.parametrize(
    "encoding, pos_embed, pos_bias, rotates",
    [
        ("nope", False, False, False),
        ("sinusoidal", True, False, False),
        ("learned", True, False, False),
        ("t5", False, True, False),
        ("alibi", False, True, False),
        ("rope", False, False, True),
        ("decoupled_rope", False, False, True),
        ("sinusoidal+rope", True, False, True),
        ("learned+alibi+rope", True, True, True),
    ],
)
def test_run_with_cache_names_and_shapes(
    make_model, tokens_fn, encoding, pos_embed, pos_bias, rotates
):
    model = make_model(encoding=encoding, attn_backend="sdpa")
    tokens = tokens_fn(3, 9, lengths=[9, 5, 9])
    logits, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    torch.testing.assert_close(logits, model(tokens), atol=1e-6, rtol=0)
    B, P, H, D, M = 3, 9, 2, 8, 16
    d_qk = D + (8 if encoding == "decoupled_rope" else 0)
    expected = {"hook_embed": (B, P, M), "hook_pooled": (B, M)}
    if pos_embed:
        expected["hook_pos_embed"] = (B, P, M)
    for layer in range(2):
        b, a = f"blocks.{layer}.", f"blocks.{layer}.attn."
        for name in (
            "hook_resid_pre",
            "hook_resid_mid",
            "hook_resid_post",
            "hook_attn_out",
            "hook_mlp_out",
        ):
            expected[b + name] = (B, P, M)
        expected.update({a + h: (B, P, H, D) for h in ("hook_q", "hook_k", "hook_v", "hook_z")})
        expected.update({a + h: (B, H, P, P) for h in ("hook_attn_scores", "hook_pattern")})
        expected[b + "mlp.hook_pre"] = expected[b + "mlp.hook_post"] = (B, P, 32)
        expected[b + "ln1.hook_scale"] = expected[b + "ln2.hook_scale"] = (B, P, 1)
        expected[b + "ln1.hook_normalized"] = expected[b + "ln2.hook_normalized"] = (B, P, M)
        if rotates:
            expected[a + "hook_rot_q"] = expected[a + "hook_rot_k"] = (B, P, H, d_qk)
        if pos_bias:
            expected[a + "hook_pos_bias"] = (H, P, P)
    expected["ln_final.hook_scale"], expected["ln_final.hook_normalized"] = (B, P, 1), (B, P, M)
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    # Consistency between a few cached activations.
    torch.testing.assert_close(
        cache["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_attn_scores"].softmax(-1)
    )
    assert cache["blocks.0.attn.hook_pattern"][1, :, :5, 5:].abs().max() == 0  # pads unseen
    torch.testing.assert_close(
        cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"], atol=0, rtol=0
    )
    embed = cache["hook_embed"] + (cache["hook_pos_embed"] if pos_embed else 0)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], embed)
    torch.testing.assert_close(cache["hook_embed"], model.W_E[tokens])


def test_cache_without_batch_dim(make_model, tokens_fn):
    model = make_model(encoding="t5")
    _, cache = model.run_with_cache(tokens_fn(1, 7), remove_batch_dim=True)
    assert isinstance(cache, ActivationCache)
    assert cache["blocks.0.attn.hook_pattern"].shape == (2, 7, 7)
    assert cache["hook_pooled"].shape == (16,)


@pytest.mark.parametrize("d_mlp", [32, 0])
def test_activation_cache_helpers(make_model, tokens_fn, d_mlp):
    """ActivationCache's residual decompositions work on our model and add up.

    Regression (fixed): ``decompose_resid`` reads ``model.cfg.attn_only``, which ModelConfig lacked."""
    model = make_model(encoding="sinusoidal+rope", init_std=0.3, d_mlp=d_mlp)
    _, cache = model.run_with_cache(tokens_fn(3, 7, lengths=[7, 3, 5]))
    final = cache["blocks.1.hook_resid_post"]
    acc = cache.accumulated_resid()
    assert acc.shape == (3, 3, 7, 16)
    torch.testing.assert_close(acc[-1], final)
    assert cache.stack_activation("pattern").shape == (2, 3, 2, 7, 7)
    parts, labels = cache.decompose_resid(return_labels=True)
    expected = ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    assert labels == [x for x in expected if d_mlp or "mlp" not in x]
    torch.testing.assert_close(parts.sum(0), final, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layer, head", [(0, 0), (1, 1)])
def test_zeroing_hook_z_equals_zeroing_W_O(make_model, tokens_fn, layer, head):
    model = make_model(encoding="sinusoidal+rope", init_std=0.3)
    tokens = tokens_fn(4, 10, lengths=LENGTHS)

    def zero_head(z, hook):
        z[:, :, head] = 0.0
        return z

    hooked = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])
    assert (hooked - model(tokens)).abs().max() > 1e-3
    ablated = copy.deepcopy(model)
    with torch.no_grad():
        ablated.blocks[layer].attn.W_O[head] = 0.0
    torch.testing.assert_close(hooked, ablated(tokens), atol=1e-6, rtol=0)


def test_hooks_context_manager(make_model, tokens_fn):
    model = make_model(encoding="rope", init_std=0.3)
    tokens = tokens_fn(2, 8)
    clean = model(tokens)
    seen = []

    def zero_resid(x, hook):
        seen.append(hook.name)
        return torch.zeros_like(x)

    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", zero_resid)]):
        inside = model(tokens)
    assert seen == ["blocks.1.hook_resid_post"]
    # ln_final of a zero residual is its bias (zero), so the logits are b_U (zero at init).
    torch.testing.assert_close(inside, model.b_U.expand(2, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(model(tokens), clean)
    assert seen == ["blocks.1.hook_resid_post"]  # removed on exit


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, 0] - logits[:, 1]).mean()


def naive_patch(model, corrupt, clean_cache, hook_name, index_fn, cells):
    """Patch ``clean_cache`` into the corrupt run cell by cell, with plain torch forward hooks."""
    out = {}
    for cell in cells:
        layer = cell[0]
        name = hook_name.format(layer=layer)
        point = model.get_submodule(name)

        def hook(module, inputs, output, _cell=cell, _name=name):
            output = output.clone()
            index = index_fn(_cell)
            output[index] = clean_cache[_name][index]
            return output

        handle = point.register_forward_hook(hook)
        try:
            with torch.no_grad():
                out[cell] = logit_diff(model(corrupt)).item()
        finally:
            handle.remove()
    return out


@pytest.mark.parametrize("encoding", ["rope", "t5"])
def test_transformer_lens_patching_matches_naive_loop(make_model, tokens_fn, encoding):
    model = make_model(encoding=encoding, init_std=0.3, n_heads=4, d_model=16)  # d_head 4
    clean = tokens_fn(3, 8, seed=1, lengths=[8, 6, 8])
    corrupt = tokens_fn(3, 8, seed=2, lengths=[8, 6, 8])
    _, clean_cache = model.run_with_cache(clean)

    heads = tl_patching.get_act_patch_attn_head_out_all_pos(model, corrupt, clean_cache, logit_diff)
    assert heads.shape == (2, 4)
    cells = [(layer, head) for layer in range(2) for head in range(4)]
    ref = naive_patch(
        model,
        corrupt,
        clean_cache,
        "blocks.{layer}.attn.hook_z",
        lambda c: (slice(None), slice(None), c[1]),
        cells,
    )
    torch.testing.assert_close(
        heads,
        torch.tensor([[ref[(layer, h)] for h in range(4)] for layer in range(2)]),
        atol=1e-5,
        rtol=0,
    )

    resid = tl_patching.get_act_patch_resid_pre(model, corrupt, clean_cache, logit_diff)
    assert resid.shape == (2, 8)
    cells = [(layer, pos) for layer in range(2) for pos in range(8)]
    ref = naive_patch(
        model,
        corrupt,
        clean_cache,
        "blocks.{layer}.hook_resid_pre",
        lambda c: (slice(None), c[1]),
        cells,
    )
    torch.testing.assert_close(
        resid,
        torch.tensor([[ref[(layer, p)] for p in range(8)] for layer in range(2)]),
        atol=1e-5,
        rtol=0,
    )
    # Patching every position of layer 0's input recovers the clean run exactly.
    full = naive_patch(
        model, corrupt, clean_cache, "blocks.{layer}.hook_resid_pre", lambda c: slice(None), [(0,)]
    )
    assert full[(0,)] == pytest.approx(logit_diff(model(clean)).item(), abs=1e-5)
    assert resid.abs().max() > 0 and heads.abs().max() > 0


# ---- resuming from a layer ----------------------------------------------------------------------
@pytest.mark.parametrize("kv_source", ["residual", "embed"])
@pytest.mark.parametrize("encoding", ["sinusoidal+rope", "t5", "learned", "decoupled_rope"])
def test_resume_from_layer(make_model, tokens_fn, encoding, kv_source):
    """Resuming from a layer's hook_resid_pre gives identical logits (eager everywhere, so the
    same kernels run on both paths and the results are bit-for-bit equal)."""
    model = make_model(
        encoding=encoding, kv_source=kv_source, init_std=0.3, n_layers=3, attn_backend="eager"
    )
    tokens = tokens_fn(4, 10, lengths=LENGTHS)
    full, cache = model.run_with_cache(tokens)
    assert torch.equal(full, model(tokens))
    for layer in range(4):
        resid = model(tokens, stop_at_layer=layer)
        if layer < 3:
            assert torch.equal(resid, cache[f"blocks.{layer}.hook_resid_pre"])
            assert torch.equal(
                model(
                    tokens, start_at_layer=layer, residual=cache[f"blocks.{layer}.hook_resid_pre"]
                ),
                full,
            )
        assert torch.equal(model(tokens, start_at_layer=layer, residual=resid), full)
        middle = model(tokens, start_at_layer=layer, stop_at_layer=3, residual=resid)
        assert torch.equal(middle, cache["blocks.2.hook_resid_post"])
    # sdpa agrees with the eager cache to float tolerance.
    sdpa = make_model(
        encoding=encoding, kv_source=kv_source, init_std=0.3, n_layers=3, attn_backend="sdpa"
    )
    resumed = sdpa(tokens, start_at_layer=2, residual=cache["blocks.2.hook_resid_pre"])
    torch.testing.assert_close(resumed, full, atol=1e-5, rtol=0)


# ---- determinism --------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["t5", "decoupled_rope", "learned+alibi"])
def test_seed_determines_parameters(make_model, encoding):
    a, b, c = (make_model(encoding=encoding, seed=s) for s in (3, 3, 4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    random = [k for k in sa if sa[k].std() > 0 and sa[k].numel() > 1]
    assert any(k.startswith("encoding.") for k in random)
    assert all(not torch.equal(sa[k], sc[k]) for k in random), [
        k for k in random if torch.equal(sa[k], sc[k])
    ]
    for k, v in sa.items():  # N(0, init_std) weights, zero biases, unit gains
        leaf = k.rsplit(".", 1)[-1]
        if leaf.startswith("b"):
            assert v.abs().max() == 0, k
        elif leaf == "w":
            assert torch.equal(v, torch.ones_like(v)), k
        else:
            assert abs(v.std().item() - 0.02) < 0.01, k


# ---- kv_source="embed" --------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["sinusoidal", "learned+rope", "nope"])
def test_kv_source_embed_reads_layer0_input(make_model, tokens_fn, encoding):
    model = make_model(encoding=encoding, kv_source="embed", init_std=0.3)
    _, cache = model.run_with_cache(tokens_fn(3, 9, lengths=[9, 4, 9]))
    x0 = cache["hook_embed"] + (cache["hook_pos_embed"] if encoding != "nope" else 0)
    for layer in range(2):
        attn = model.blocks[layer].attn
        k = torch.einsum("bpm,hmd->bphd", x0, attn.W_K) + attn.b_K
        v = torch.einsum("bpm,hmd->bphd", x0, attn.W_V) + attn.b_V
        q = (
            torch.einsum("bpm,hmd->bphd", cache[f"blocks.{layer}.ln1.hook_normalized"], attn.W_Q)
            + attn.b_Q
        )
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_k"], k, atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_v"], v, atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_q"], q, atol=1e-6, rtol=0)


def test_kv_source_residual_reads_normalised_stream(make_model, tokens_fn):
    model = make_model(encoding="sinusoidal", init_std=0.3)
    _, cache = model.run_with_cache(tokens_fn(2, 9))
    attn = model.blocks[1].attn
    x = cache["blocks.1.ln1.hook_normalized"]
    k = torch.einsum("bpm,hmd->bphd", x, attn.W_K) + attn.b_K
    torch.testing.assert_close(cache["blocks.1.attn.hook_k"], k, atol=1e-6, rtol=0)
    x0 = cache["hook_embed"] + cache["hook_pos_embed"]
    assert (
        cache["blocks.1.attn.hook_k"] - torch.einsum("bpm,hmd->bphd", x0, attn.W_K)
    ).abs().max() > 1e-2


# ---- a few end-to-end numbers -------------------------------------------------------------------
def test_attention_scale_and_mask(make_model, tokens_fn):
    """Scores are q.k/sqrt(d_head) plus -inf on masked keys (causal and padding)."""
    model = make_model(encoding="nope", attention_dir="causal", init_std=0.3)
    tokens = tokens_fn(2, 6, lengths=[6, 4])
    _, cache = model.run_with_cache(tokens)
    q, k = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_k"]
    scores = cache["blocks.0.attn.hook_attn_scores"]
    expected = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].repeat(2, 2, 1, 1)
    allowed[1, :, :, 4:] &= torch.eye(6, dtype=torch.bool)[:, 4:]  # pad keys: only themselves
    torch.testing.assert_close(scores[allowed], expected[allowed], atol=1e-6, rtol=0)
    assert torch.isinf(scores[~allowed]).all() and (scores[~allowed] < 0).all()


def test_training_step_reduces_loss_on_a_fixed_batch(make_config, tokens_fn):
    torch.manual_seed(0)
    model = HookedPETransformer(
        make_config(encoding="sinusoidal+rope", dropout=0.1, attn_dropout=0.1)
    ).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens, labels = tokens_fn(8, 10, lengths=[10, 9, 8, 7, 6, 5, 4, 3]), labels_for(8)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]

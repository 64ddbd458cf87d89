"""Route shares, the positional criterion's measure, on a TransformerLens bridge (issues 36, 38).

References built here and not by the probe: the model's positional effect ("every route sees σ")
against the Hugging Face model itself run with ``position_ids = σ``; each head's own share against
a naive loop that rotates that head's queries and keys with tables computed here from the config
(``rope_theta``, the rotary share of each head)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bridge_env import sharp_bridge

from pe_interp.models.bridge.hf_arch import (
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel
from probes import positional_dominance, route_shares
from probes.common.inputs import position_permutation

V, PAD, N, P = 30, 0, 16, 9
ANSWERS = [26, 27, 28, 29]
SHAPE = {
    "n_layers": 2,
    "d_model": 32,
    "n_heads": 2,
    "d_mlp": 40,
    "n_ctx": 16,
    "d_vocab": V,
    "pad_id": PAD,
}


@pytest.fixture(scope="module", params=["llama", "gpt-neox", "gpt2", "bloom"])
def built(request, tmp_path_factory):
    arch = request.param  # sharper attention than the initialisation's, so that positions matter
    hf, model, _ = sharp_bridge(
        arch, SHAPE, 3, 12.0, tmp_path_factory.mktemp(arch) / "model", ANSWERS
    )
    return arch, hf, model


def _pairs(n: int = N):
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 26, (n, P), generator=g)
    order = torch.stack([torch.randperm(P, generator=g) for _ in range(n)])
    corrupt = clean.gather(1, order)
    good = torch.randint(0, 4, (n,), generator=g)
    return clean, corrupt, good, (good + 1) % 4


def _ld(logits, good, bad):
    return (logits.gather(1, good[:, None])[:, 0] - logits.gather(1, bad[:, None])[:, 0]).double()


def _rotate_one_head(hf, model, sigma, layer, head):
    """Hooks that turn head ``head``'s queries and keys of ``layer`` to the positions ``sigma``
    (before the bridge rotates them at their own), with angles from the config."""
    c = hf.config
    d = SHAPE["d_model"] // SHAPE["n_heads"]
    rope = getattr(c, "rope_parameters", None) or {}
    r = int(d * rope.get("partial_rotary_factor", 1.0)) // 2 * 2
    inv = 1.0 / rope.get("rope_theta", 10000.0) ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = (
        sigma.double()[..., None] * inv - torch.arange(P, dtype=torch.float64)[None, :, None] * inv
    )  # [n, P, r/2]
    cos, sin = ang.cos().float(), ang.sin().float()

    def turn(x, hook):
        x = x.clone()
        y0, y1 = x[:, :, head, : r // 2].clone(), x[:, :, head, r // 2 : r].clone()
        x[:, :, head, : r // 2] = y0 * cos - y1 * sin
        x[:, :, head, r // 2 : r] = y0 * sin + y1 * cos
        return x

    return [(f"blocks.{layer}.attn.hook_{c}", turn) for c in "qk"]


def _alibi_slopes(n_heads: int) -> torch.Tensor:
    """BLOOM's slopes for a power-of-two number of heads, from the ALiBi paper's formula."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)])


def _move_one_bias(sigma, layer, head):
    """A hook that gives head ``head`` of ``layer`` its ALiBi bias at the positions ``sigma``:
    BLOOM adds ``slope * j`` for key ``j``, so add ``slope * (sigma(j) - j)`` where the mask allows."""
    slope = float(_alibi_slopes(SHAPE["n_heads"])[head])

    def move(scores, hook):
        scores = scores.clone()
        shift = slope * (sigma - torch.arange(P)[None]).to(scores.dtype)  # [n, k]
        allowed = scores[:, head] > -1e30
        scores[:, head] = torch.where(allowed, scores[:, head] + shift[:, None, :], scores[:, head])
        return scores

    return [(f"blocks.{layer}.attn.hook_attn_scores", move)]


def _alibi_at(sigma):
    """A stand-in for BLOOM's ``build_alibi_tensor`` that builds its ALiBi tensor at the positions
    ``sigma`` (Hugging Face's layout, ``[batch * heads, 1, keys]``; the causal mask stays at the
    true positions)."""

    def alibi(attention_mask, num_heads, dtype):
        a = _alibi_slopes(num_heads)[None, :, None] * sigma[:, None, :].to(torch.float32)
        return a.reshape(-1, 1, sigma.shape[1]).to(dtype)

    return alibi


def test_route_shares_on_a_bridge_equal_the_hugging_face_model_and_a_naive_loop(built):
    arch, hf, model = built
    clean, corrupt, good, bad = _pairs()
    r = route_shares(model, clean, corrupt, good, bad, n_bootstrap=0)
    sigma = position_permutation(clean, corrupt)
    with torch.no_grad():
        ld_clean = _ld(hf(clean).logits[:, -1][:, ANSWERS], good, bad)
        if arch == "bloom":  # ALiBi from the attention mask, not position_ids: build it at sigma
            hf.transformer.build_alibi_tensor = _alibi_at(sigma)
            try:  # (with a mask: without one, BLOOM builds its ALiBi without calling the method)
                ld_all = _ld(
                    hf(clean, attention_mask=torch.ones_like(clean)).logits[:, -1][:, ANSWERS],
                    good,
                    bad,
                )
            finally:
                del hf.transformer.build_alibi_tensor  # the class's own method again
        else:
            ld_all = _ld(hf(clean, position_ids=sigma).logits[:, -1][:, ANSWERS], good, bad)
    effect = float((ld_clean - ld_all).mean())
    assert abs(effect) > 1e-3 and r.effect == pytest.approx(effect, rel=1e-4, abs=1e-6)
    if arch == "gpt2":  # learned positions enter the residual stream once: one route, the embedding
        assert not r.routes.any() and r.embed == pytest.approx(1.0)
        assert (
            positional_dominance(r).verdict == "no"
        )  # a deposit is a head; here position enters none
        return
    assert r.routes.all()
    for layer in range(2):
        for head in range(2):
            hooks = (
                _move_one_bias(sigma, layer, head)
                if arch == "bloom"
                else _rotate_one_head(hf, model, sigma, layer, head)
            )
            with torch.no_grad():
                logits = model.run_with_hooks(clean, fwd_hooks=hooks)
            share = float((ld_clean - _ld(logits, good, bad)).mean()) / effect
            assert r.shares[layer, head] == pytest.approx(share, rel=1e-3, abs=1e-4), (layer, head)
    assert np.isfinite(r.shares).all()


@pytest.mark.parametrize("arch", ["llama", "gpt-neox"])
def test_a_bridge_with_one_planted_positional_head_gets_a_yes_that_names_it(arch, tmp_path):
    """Ground truth on a real architecture: every query and key projection is zero but head 1 of
    layer 0's, so no other head's logits can depend on position (they attend uniformly over the
    causal prefix). The positional criterion must name that head with share 1 and every other 0,
    and say "yes"; the decomposition's direct term must name it too."""
    from probes import positional_scores

    shape = {**SHAPE, "n_heads": 4, "d_model": 32}
    d, planted = 8, (0, 1)
    hf = build_hf_model(arch, seed=3, **shape)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            layer = int(name.split(".")[2]) if ".layers." in name else None
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                rows = p.view(4, d, -1)
            elif arch == "gpt-neox" and "query_key_value" in name:
                rows = p.view(4, 3, d, -1)[:, :2] if p.ndim == 2 else p.view(4, 3, d)[:, :2]
            else:
                if name.endswith(("lm_head.weight", "embed_out.weight")):
                    p.mul_(100.0)  # a positional effect well above the criterion's 0.1 logits
                continue
            for h in range(4):
                rows[h] = rows[h] * 20.0 if (layer, h) == planted else 0.0
    model = BridgedModel(
        boot_bridge(save_model_dir(hf, word_tokenizer(V, PAD), tmp_path / "m")), answers=ANSWERS
    )
    clean, corrupt, good, bad = _pairs(64)  # a verdict needs >= 59 pairs (decision.min_examples)
    r = route_shares(model, clean, corrupt, good, bad, n_bootstrap=200)
    assert abs(r.effect) > 0.1
    assert r.shares[planted] == pytest.approx(1.0, abs=1e-6)
    assert np.count_nonzero(np.abs(r.shares) > 1e-9) == 1
    verdict = positional_dominance(r)
    assert verdict.verdict == "yes" and verdict.top == "L0H1"
    assert positional_scores(model, clean, pad_mask=None).entry() == planted

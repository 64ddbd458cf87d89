"""σ-aligned attribution and faithfulness (issue 36): on position-only pairs each clean token is
compared with itself at its moved position, so a unit blind to position scores 0 (to float rounding: the moved keys are summed in another
order).

Ground truth by construction: with bidirectional attention, mean pooling and no absolute encoding,
a head without a positional encoding is permutation-equivariant in its inputs, so its output at
the moved position equals its clean output exactly; a model with no encoding at all is blind
everywhere. A plain autograd loop written here is the reference for the scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.tasks.batch import Batch, CounterfactualPairs
from probes import attribute
from probes.circuits import faithfulness_curve
from probes.circuits.alignment import moved
from probes.circuits.engine import as_pair

VOCAB, CLASSES = 20, 5


def _model(encoding: str) -> HookedPETransformer:
    cfg = ModelConfig(
        n_layers=2,
        d_model=18,
        n_heads=3,
        d_mlp=32,
        n_ctx=10,
        d_vocab=VOCAB,
        n_classes=CLASSES,
        encoding=encoding,
        init_std=0.4,
        seed=3,
    )
    return HookedPETransformer(cfg).double().eval()


def _position_pairs(n: int = 6, pos: int = 9, seed: int = 0) -> CounterfactualPairs:
    """Each corrupt row is its clean row's real tokens in another order (pads stay put)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, pos + 1, (n,), generator=g)
    mask = torch.arange(pos)[None] < lengths[:, None]
    clean = torch.randint(1, VOCAB, (n, pos), generator=g) * mask
    corrupt = clean.clone()
    for b in range(n):
        k = int(lengths[b])
        corrupt[b, :k] = clean[b, torch.randperm(k, generator=g)]
    good = torch.randint(0, CLASSES, (n,), generator=g)
    return CounterfactualPairs(Batch(clean, good, mask), Batch(corrupt, (good + 1) % CLASSES, mask))


def _naive_head_scores(model, pairs) -> np.ndarray:
    """sum_i (z_clean[i] - z_corrupt[σ(i)]) . dm/dz_corrupt[σ(i)] per head, m the clean label's
    log-probability, averaged over rows: the aligned denoising AtP estimate, by plain autograd."""
    c, k = as_pair(model, pairs, None)
    sigma = moved(c, k, "test")
    _, cache = model.run_with_cache(pairs.clean.tokens, pairs.clean.pad_mask)
    zs = {}

    def keep(z, hook):
        zs[hook.name] = torch.zeros_like(z, requires_grad=True)
        return z + zs[hook.name]

    names = [f"blocks.{layer}.attn.hook_z" for layer in range(2)]
    _, corrupt = model.run_with_cache(pairs.corrupt.tokens, pairs.corrupt.pad_mask)
    with model.hooks(fwd_hooks=[(n, keep) for n in names]):
        logits = model(pairs.corrupt.tokens, pairs.corrupt.pad_mask)
    m = logits.log_softmax(-1).gather(1, pairs.clean.labels[:, None]).sum()
    grads = torch.autograd.grad(m, [zs[n] for n in names])
    out = np.zeros((2, 3))
    for layer, (name, g) in enumerate(zip(names, grads)):
        for b in range(len(sigma)):
            moved_z = corrupt[name][
                b, sigma[b]
            ]  # [pos, head, d]: the corrupt value of each clean token
            moved_g = g[b, sigma[b]]
            out[layer] += ((cache[name][b] - moved_z) * moved_g).sum((0, 2)).detach().numpy()
    return out / len(sigma)


def test_aligned_scores_equal_a_naive_loop_and_are_zero_on_blind_heads():
    model = _model("rope(heads=(1,), layers=(0,))")  # only L0H1 sees position
    pairs = _position_pairs()
    got = attribute(model, pairs, aligned=True)
    heads = np.array(
        [[got.scores[got.writers.index(f"L{a}H{h}")] for h in range(3)] for a in range(2)]
    )
    np.testing.assert_allclose(heads, _naive_head_scores(model, pairs), rtol=1e-9, atol=1e-12)
    # blind layer-0 heads: their two values are equal (up to the summation order over moved keys)
    assert abs(heads[0, 0]) < 1e-12 and abs(heads[0, 2]) < 1e-12
    assert abs(heads[0, 1]) > 1e-4  # the route is not
    assert (
        abs(got.scores[got.writers.index("embed")]) < 1e-12
    )  # the same tokens, read where they went
    plain = attribute(model, pairs)
    assert (
        abs(plain.scores[plain.writers.index("L0H0")]) > 1e-4
    )  # at a fixed index, a blind head looks positional


def test_aligned_edges_out_of_blind_units_are_zero_and_faithfulness_of_a_blind_model_is_trivial():
    model = _model("rope(heads=(1,), layers=(0,))")
    pairs = _position_pairs(seed=1)
    edges = attribute(model, pairs, granularity="edge", aligned=True)
    for writer in ("embed", "L0H0", "L0H2"):
        col = edges.scores[:, edges.writers.index(writer)]
        assert np.nanmax(np.abs(col)) < 1e-12, writer
    assert np.nanmax(np.abs(edges.scores[:, edges.writers.index("L0H1")])) > 1e-4
    nope = _model(
        "nope"
    )  # blind everywhere: the aligned corrupt run is the clean run, token by token
    curve = faithfulness_curve(
        nope,
        attribute(nope, pairs, granularity="edge", aligned=True),
        pairs,
        sizes=[0],
        aligned=True,
        metric="logit_diff",
    )
    assert curve["full"] == pytest.approx(curve["empty"], abs=1e-12)
    plain = faithfulness_curve(
        nope, attribute(nope, pairs, granularity="edge"), pairs, sizes=[0], metric="logit_diff"
    )
    assert plain["full"] == pytest.approx(
        plain["empty"], abs=1e-9
    )  # the model is blind to order either way


def test_aligned_refuses_what_it_cannot_align():
    model = _model("rope")
    pairs = _position_pairs()
    g = torch.Generator().manual_seed(4)
    other = CounterfactualPairs(
        pairs.clean,
        Batch(
            torch.randint(1, VOCAB, pairs.clean.tokens.shape, generator=g) * pairs.clean.pad_mask,
            pairs.corrupt.labels,
            pairs.clean.pad_mask,
        ),
    )
    with pytest.raises(
        ValueError,
        match=r"attribute: aligned=True: row 0: the counterfactual is not the same tokens moved",
    ):
        attribute(model, other, aligned=True)
    with pytest.raises(ValueError, match=r"aligned=True is for method='atp'"):
        attribute(model, pairs, method="eap-ig", aligned=True)
    with pytest.raises(ValueError, match=r"it needs position-only pairs"):
        attribute(model, pairs.clean, aligned=True)
    with pytest.raises(ValueError, match=r"needs ablation='corrupt', got 'mean'"):
        faithfulness_curve(
            model,
            attribute(model, pairs, granularity="edge"),
            pairs,
            sizes=[0],
            aligned=True,
            ablation="mean",
        )


def test_the_aligned_circuit_of_the_planted_model_holds_its_route_and_no_blind_layer0_head(
    tmp_path, capsys
):
    """checkpoints/planted-one-route: RoPE on L0H3 alone (bidirectional, no absolute encoding),
    so every other layer-0 head is blind by construction."""
    from pathlib import Path

    from pe_interp.cli import main
    from probes import Circuit

    ckpt = Path(__file__).resolve().parents[1] / "checkpoints" / "planted-one-route"
    argv = [
        "circuit",
        str(ckpt),
        "--method",
        "atp",
        "--aligned",
        "--faithful",
        "0.9",
        "--n",
        "48",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    c = Circuit.load(tmp_path / "circuit.json")
    writers = {w for w, _ in c.edges}
    assert (
        "L0H3" in writers
        and not {f"L0H{h}" for h in range(8) if h != 3} & writers
        and "embed" not in writers
    )
    assert (
        c.faithfulness["kept"] >= 0.9
        and c.meta["aligned"] is True
        and c.meta["selection"]["select"] == "top"
    )
    capsys.readouterr()
    assert main([*argv, "--select", "paths"]) != 0
    assert "--aligned: position enters at the routes themselves" in capsys.readouterr().err
    assert main(["circuit", str(ckpt), "--aligned", "--out", str(tmp_path)]) != 0
    assert "it needs --method atp and --counterfactual position" in capsys.readouterr().err

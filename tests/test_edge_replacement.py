"""The edge evaluator reads a hook-keyed Replacement (issue 53): for zero, mean, resample and the
corrupt run (σ-aligned too) it gives the numbers of :func:`ablated_metric` fed the replacement
terms built here the way the evaluator built them before it took a Replacement (the corrupt or a
resampled run captured at the writer hooks, σ-gathered, a plain mean per position, zeros), chunk
by chunk; and the head ablation keys the same seam by ``hook_z``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from circuit_env import FN, random_model, random_pairs

from probes.ablation import resample_sources
from probes.circuits.edge_ablation import ablated_metric
from probes.circuits.engine import as_pair, capture, contributions, writer_hooks
from probes.circuits.evaluator import EdgeEvaluator
from probes.circuits.graph import build_graph
from probes.common.inputs import position_permutation
from probes.common.replace import ZeroReplacement, replacement

ROWS = 2  # rows per forward: the three pairs in two chunks


def _keeps(graph, n: int = 5, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keeps = rng.random((n, *graph.valid.shape, 1)) < 0.5
    keeps[0], keeps[1] = True, False  # everything kept, nothing kept
    return keeps


def _reference(ev: EdgeEvaluator, repl_of, keeps: np.ndarray) -> np.ndarray:
    """:func:`ablated_metric` chunk by chunk and mask by mask (as the evaluator splits the work at
    two rows a forward), reading the terms ``repl_of(slice)`` gives."""
    c, out = ev.c, np.empty((len(keeps), len(ev.c)))
    for c0 in range(0, len(c), ROWS):
        sl = slice(c0, c0 + ROWS)
        with torch.no_grad():
            repl = repl_of(sl)
        args = (ev.fn, ev.good[sl], ev.bad[sl])
        for j, keep in enumerate(torch.as_tensor(keeps)):
            got = ablated_metric(ev.model, ev.graph, c.rows(sl), repl, keep[None], *args)
            out[j, sl] = got[0].numpy()
    return out


def _terms(model, graph, run) -> torch.Tensor:
    return contributions(model, graph, capture(model, run, writer_hooks(graph))[0])


def _evaluator(model, clean, corrupt, ablation, **kw) -> EdgeEvaluator:
    how = {"metric": FN, "reference": None, "seed": 4, "batch_size": ROWS}
    return EdgeEvaluator(
        model, clean, corrupt, ablation=ablation, spans=None, n_spans=1, **{**how, **kw}
    )


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_corrupt_and_resample_read_the_runs_they_name(encoding):
    model = random_model(encoding)
    clean, corrupt = random_pairs()
    ev = _evaluator(model, clean, corrupt, "corrupt")
    keeps = _keeps(ev.graph)
    want = _reference(ev, lambda sl: _terms(model, ev.graph, ev.k.rows(sl)), keeps)
    np.testing.assert_array_equal(ev(keeps), want)
    assert ev.ablation == "corrupt"

    ev = _evaluator(model, clean, None, "resample")
    src = resample_sources(len(clean), None, 4)  # the seeded derangement
    resampled = as_pair(model, clean[src], None)[0]
    want = _reference(ev, lambda sl: _terms(model, ev.graph, resampled.rows(sl)), keeps)
    np.testing.assert_array_equal(ev(keeps), want)


def test_zero_reads_nothing_for_every_writer():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    names = tuple(writer_hooks(build_graph(model.cfg)))
    ev = _evaluator(model, clean, corrupt, ZeroReplacement(names))
    keeps = _keeps(ev.graph)
    P, W, d = clean.shape[1], len(ev.graph.writers), model.cfg.d_model
    want = _reference(ev, lambda sl: torch.zeros(1, P, W, d, dtype=torch.float64), keeps)
    np.testing.assert_array_equal(ev(keeps), want)
    assert ev.ablation == "zero"
    assert not np.array_equal(want[1], _evaluator(model, clean, corrupt, "corrupt")(keeps)[1])


def test_mean_is_the_plain_mean_per_position_over_the_reference():
    model = random_model("alibi")
    clean, corrupt = random_pairs()
    g = torch.Generator().manual_seed(3)
    calib = torch.randint(1, 20, (5, 9), generator=g)  # no pads, longer than the examples
    ev = _evaluator(model, clean, corrupt, "mean", reference=calib)
    keeps = _keeps(ev.graph)
    acts = capture(model, as_pair(model, calib, None)[0], writer_hooks(ev.graph))[0]
    P = clean.shape[1]
    means = {n: a.mean(0, keepdim=True)[:, :P] for n, a in acts.items()}  # a plain mean, float64
    want = _reference(ev, lambda sl: contributions(model, ev.graph, means), keeps)
    np.testing.assert_allclose(ev(keeps), want, rtol=1e-12, atol=1e-12)


def test_aligned_corrupt_reads_each_token_at_its_moved_position():
    model = random_model("rope")
    clean, _ = random_pairs()
    g = torch.Generator().manual_seed(1)
    moved = clean.clone()
    for b in range(len(clean)):  # the row's real tokens in another order, pads in place
        k = int((clean[b] != 0).sum())
        moved[b, :k] = clean[b, torch.randperm(k, generator=g)]
    ev = _evaluator(model, clean, moved, "corrupt", aligned=True)
    sigma = position_permutation(clean, moved)
    keeps = _keeps(ev.graph)

    def aligned(sl: slice) -> torch.Tensor:
        acts = capture(model, ev.k.rows(sl), writer_hooks(ev.graph))[0]
        s = sigma[sl]
        gathered = {
            n: a.gather(1, s.view(*s.shape, *[1] * (a.ndim - 2)).expand_as(a))
            for n, a in acts.items()
        }
        return contributions(model, ev.graph, gathered)

    np.testing.assert_array_equal(ev(keeps), _reference(ev, aligned, keeps))


def test_a_replacement_is_keyed_by_hook_name():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    pad = clean != 0
    names = ["blocks.1.attn.hook_z", "blocks.2.hook_mlp_out"]
    got = replacement(model, "corrupt", names, clean, pad, reference=(corrupt, corrupt != 0))
    values = got.for_chunk(torch.tensor([2, 0]), clean.shape[1])
    acts = capture(model, as_pair(model, corrupt[[2, 0]], None)[0], names)[0]
    assert list(values) == names and got.method == "corrupt"
    for n in names:
        torch.testing.assert_close(values[n], acts[n], rtol=0, atol=0)
    zero = replacement(model, "zero", names, clean, pad).for_chunk(torch.tensor([1]), 4)
    assert zero == dict.fromkeys(names)


def test_a_replacement_that_leaves_a_writer_out_is_refused():
    model = random_model("rope")
    clean, corrupt = random_pairs()
    heads = tuple(n for n in writer_hooks(build_graph(model.cfg)) if n != "hook_embed")
    with pytest.raises(
        ValueError, match=r"^faithfulness: the Replacement leaves writer hooks out: hook_embed$"
    ):
        _evaluator(model, clean, corrupt, ZeroReplacement(heads))
    with pytest.raises(
        ValueError, match=r"ablation must be one of corrupt, resample, mean or a Replacement"
    ):
        _evaluator(model, clean, corrupt, "zero")

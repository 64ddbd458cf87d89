"""``pe-interp circuit MODEL.gguf --task induction --faithful 0.9 --counterfactual position`` on
a Gemma 3 GGUF file (issue 55): a norm after attention and after the MLP, QK-norm, one key/value
head (multi-query, as Gemma 3 270M), sliding and global layers. Nothing is downloaded.

The model is tiny and random, built from its config (:func:`test_post_norm_edges.sharpened`) and
written as llama.cpp writes Gemma 3 (:func:`test_gguf.write_gguf`: RMSNorm scales stored as
``1 + weight``, no q/k permutation, a sentencepiece vocabulary laid out as Gemma's). A Gemma 3
GGUF file says nothing of which layers are global: llama.cpp and transformers both take every
sixth, so six layers make five sliding ones and one global. Nor of ``query_pre_attn_scalar``:
transformers takes 256, and so does the model built here.

References written here: the converted model's logits against the original's; the written
circuit's faithfulness recomputed on the held-out pairs by the naive hook loop on the Hugging Face
layers themselves (:func:`test_post_norm_edges.naive_logits`: each cut edge's term replaced in the
receiver's own input at the positions of its span, the norm after attention run again)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from test_gguf import VOCAB, write_gguf  # noqa: E402
from test_post_norm_edges import naive_logits, sharpened  # noqa: E402

from pe_interp.cli import main  # noqa: E402
from pe_interp.runs import gguf as pg  # noqa: E402
from probes import Circuit  # noqa: E402
from probes.circuits.graph import build_graph  # noqa: E402

LAYERS, HEADS, N = 6, 2, 16
GEMMA3 = {  # what a Gemma 3 GGUF file carries, and transformers' defaults for what it does not
    "vocab_size": VOCAB,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "layer_types": None,  # every sixth layer global
    "query_pre_attn_scalar": 256,
    "sliding_window": 32,  # longer than the induction prompts (19 tokens with BOS)
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}


def _gemma3(path, **more):
    hf = sharpened("gemma3", **{**GEMMA3, **more})
    return hf, write_gguf(hf, path)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return _gemma3(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every conversion goes to this test's cache, never the user's."""
    monkeypatch.setenv(pg.CACHE_ENV, str(tmp_path / "cache"))


def test_a_gemma3_gguf_loads_to_the_original_model(gemma3):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import pe_interp

    hf, path = gemma3
    converted = pg.convert_gguf(path)
    again = AutoModelForCausalLM.from_pretrained(converted).eval()
    cfg = again.config
    assert type(again).__name__ == "Gemma3ForCausalLM" and cfg.num_key_value_heads == 1
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert cfg.rope_parameters == hf.config.rope_parameters and cfg.sliding_window == 32
    ids = torch.randint(0, VOCAB, (3, 21), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids).logits
        gap = float((again(ids).logits - want).abs().max())
        model = pe_interp.load(path)  # the whole vocabulary, read at the last position
        via_load = float((model(ids) - want[:, -1]).abs().max())
    print(f"gemma3 gguf: logits gap {gap:.1e} (transformers), {via_load:.1e} (pe_interp.load)")
    assert gap <= 1e-5 and via_load <= 1e-5 and float(want.std()) > 1.0
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert len(tokenizer) == VOCAB and tokenizer.bos_token_id == 2 and tokenizer.pad_token_id == 0
    assert tokenizer.tokenize(" the thin") == ["\u2581the", "\u2581th", "in"]


def test_the_circuit_command_on_a_gemma3_gguf_matches_a_naive_loop(gemma3, tmp_path, capsys):
    """The smallest position-aware circuit reaching 0.9 on the held-out position pairs; its
    recorded faithfulness is the naive loop's on the Hugging Face layers, edge by edge at each
    edge's span."""
    import pe_interp

    hf, path = gemma3
    out = tmp_path / "out"
    argv = ["circuit", str(path), "--task", "induction", "--faithful", "0.9"]
    argv += ["--counterfactual", "position", "--n", str(N), "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr()
    assert "the smallest circuit with faithfulness >= 0.9" in said.out
    assert said.err == ""  # --no-progress: no bar, the conversion's save included
    c = Circuit.load(out / "circuit.json")
    f = c.faithfulness
    assert c.positional and c.meta["post_norm"] == "jacobian" and f["n_pairs"] == N
    assert f["kept"] >= 0.9 and 0 < len(c.edges) < c.total_edges
    assert {r for _, r in c.edges if r.endswith((".k", ".v"))} <= {
        f"L{layer}KV0.{x}" for layer in range(LAYERS) for x in "kv"
    }  # one key/value head: its k and v are each layer's only k/v readers
    # the held-out pairs (seed + 1), as the command drew them, and their spans
    task = pe_interp.load(path, task="induction").origin.task
    pairs = task.counterfactuals(N, kind="position", seed=1)
    clean, corrupt = pairs.clean.tokens, pairs.corrupt.tokens
    assert bool(pairs.clean.pad_mask.all()) and bool(pairs.corrupt.pad_mask.all())  # no pads
    spans = task.spans(pairs.clean)
    graph = build_graph(pe_interp.load(path).cfg)
    kept = c.keep_mask(graph)

    def cut_where(keep):  # every ablated (edge, span) unit, at that span's positions
        r, w, s = np.nonzero(graph.valid[..., None] & ~keep)
        return [(graph.writers[j], graph.readers[i], spans == k) for i, j, k in zip(r, w, s)]

    def margin(cut) -> float:  # the label's logit minus the largest other, mean over the pairs
        logits = naive_logits(hf, graph, clean, corrupt, cut).double()
        good = pairs.clean.labels
        own = logits.gather(1, good[:, None])[:, 0]
        other = logits.scatter(1, good[:, None], float("-inf")).max(1).values
        return float((own - other).mean())

    full, empty = margin([]), margin(cut_where(np.zeros_like(kept)))
    ours = margin(cut_where(kept))
    naive = (ours - empty) / (full - empty)
    gap = np.abs(np.subtract([f["full"], f["empty"], f["metric_kept"]], [full, empty, ours]))
    print(
        f"gemma3 gguf circuit: {len(c.edges)} of {c.total_edges} units, faithfulness "
        f"{f['kept']:.6f} recorded, {naive:.6f} naive (|diff| {abs(naive - f['kept']):.1e}); "
        f"full {full:.4f}, empty {empty:.4f}, max |metric diff| {gap.max():.1e}"
    )
    np.testing.assert_allclose(
        [f["full"], f["empty"], f["metric_kept"]], [full, empty, ours], atol=1e-5, rtol=0
    )
    assert abs(full - empty) > 0.05 and abs(naive - f["kept"]) <= 1e-4
    saved = json.loads((out / "circuit.json").read_text())
    assert saved["weights"]["source"]["gguf"]["architecture"] == "gemma3"


def test_prompts_longer_than_the_sliding_window_are_refused_in_one_line(tmp_path, capsys):
    _, path = _gemma3(tmp_path / "narrow.gguf", sliding_window=8)
    out = tmp_path / "out"
    argv = ["circuit", str(path), "--task", "induction", "--faithful", "0.9"]
    argv += ["--counterfactual", "position", "--n", str(N), "--no-progress", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    print(err)
    assert err.count("\n") == 1 and "window" in err
    assert not out.exists()

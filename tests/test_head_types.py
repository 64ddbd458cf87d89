"""Positional head types (``probes.heads.types``, issue 47 item 4a) against independent references.

- TransformerLens' own ``detect_head`` (TL 4.3), run on a list of prompts: on a raw
  ``TransformerBridge`` (a tiny Llama with grouped key/value heads, built offline from a config)
  through its own tokenizer, and on our ``HookedPETransformer`` through a small adapter that
  gives it ``to_tokens`` (detect_head asks nothing else of a model but ``cfg`` and
  ``run_with_cache``); default semantics and the exclusions.
- A naive per-prompt loop written here: each prompt run alone, unpadded, with a full cache, and
  every head scored with TransformerLens' detection patterns and similarity score; focus (the
  mean attention on targets of the queries that have one), coverage and the first-token score
  (Gu et al. 2024: the mean attention to the first token) read from the same patterns.
- The forward count (a pre-hook on the first block), padding, the early stop, save/load, the
  figure and ``pe-interp heads`` on a saved model directory.
"""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bridge_env import sharp_bridge
from conftest import tiny_model
from transformer_lens import head_detector as hd

from probes.heads.types import (
    DEFAULT_THRESHOLDS,
    HEAD_TYPES,
    TL_HEAD_NAMES,
    HeadTypeScores,
    head_type_scores,
)

V, PAD = 30, 0
LLAMA = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_mlp": 40, "n_ctx": 16, "d_vocab": V}
LLAMA |= {"pad_id": PAD, "n_kv_heads": 2}
LENGTHS = (5, 11, 8, 3, 10, 7, 9)


def _prompts(lengths, high: int, seed: int = 0) -> list[torch.Tensor]:
    """Token rows in ``[1, high)``: a small range, so tokens repeat; every other row a repeated
    random sequence (induction targets)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, n in enumerate(lengths):
        if i % 2:
            half = torch.randint(1, high, ((n + 1) // 2,), generator=g)
            rows.append(torch.cat([half, half])[:n])
        else:
            rows.append(torch.randint(1, high, (n,), generator=g))
    return rows


def _padded(rows, width: int | None = None) -> torch.Tensor:
    out = torch.full((len(rows), width or max(len(r) for r in rows)), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _ours(**overrides):
    """A tiny model of ours in float64, its queries and keys scaled up so the patterns differ."""
    model = tiny_model("rope", double=True, **overrides)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.mul_(6.0)
            block.attn.W_K.mul_(6.0)
    return model


class _Detectable:
    """Our model as ``detect_head`` reads a model: ``cfg``, ``to_tokens`` (a prompt is its ids
    written out) and ``run_with_cache``."""

    def __init__(self, model):
        self.model = model
        c = model.cfg
        self.cfg = SimpleNamespace(
            n_layers=c.n_layers, n_heads=c.n_heads, n_ctx=c.n_ctx, device="cpu", dtype=torch.float64
        )

    def to_tokens(self, text):
        if isinstance(text, list):  # detect_head tokenizes the list first, then each prompt
            return torch.zeros(len(text), 2, dtype=torch.long)
        return torch.tensor([[int(w) for w in text.split()]])

    def run_with_cache(self, tokens, **kwargs):
        return self.model.run_with_cache(tokens, **kwargs)


def _naive(model, rows, run_one) -> dict[str, dict]:
    """Scores, focus and coverage from a loop over prompts and heads: ``run_one(row)`` is one
    prompt's cache ``[layer] -> [head, q, k]`` with nothing padded."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    score = {k: np.zeros((len(rows), L, H)) for k in HEAD_TYPES}
    focus = {k: [[[] for _ in range(H)] for _ in range(L)] for k in HEAD_TYPES}
    cover = {k: [] for k in HEAD_TYPES}
    for i, row in enumerate(rows):
        patterns = run_one(row)
        n = len(row)
        dets = {
            k: getattr(hd, f"get_{TL_HEAD_NAMES[k]}_detection_pattern")(row[None].cpu()).double()
            for k in TL_HEAD_NAMES
        }
        dets["first_token"] = torch.zeros(n, n, dtype=torch.float64)
        dets["first_token"][:, 0] = 1
        for kind, det in dets.items():
            rows_with = det.sum(-1) > 0
            cover[kind].append(float(rows_with.double().mean()))
            for layer in range(L):
                for head in range(H):
                    a = patterns[layer][head].double()
                    if kind == "first_token":
                        score[kind][i, layer, head] = float(a[:, 0].mean())
                    else:
                        score[kind][i, layer, head] = hd.compute_head_attention_similarity_score(
                            a,
                            det,
                            exclude_bos=False,
                            exclude_current_token=False,
                            error_measure="mul",
                        )
                    if bool(rows_with.any()):
                        on = (a * det).sum(-1)[rows_with]
                        focus[kind][layer][head].append(float(on.mean()))
    return {
        "scores": {k: v.mean(0) for k, v in score.items()},
        "focus": {
            k: np.array([[np.mean(c) if c else math.nan for c in r] for r in v])
            for k, v in focus.items()
        },
        "coverage": {k: float(np.mean(v)) for k, v in cover.items()},
    }


def _our_cache(model):
    def run_one(row):
        _, cache = model.run_with_cache(row[None])
        return [cache["pattern", layer][0] for layer in range(model.cfg.n_layers)]

    return run_one


def _assert_equal(r: HeadTypeScores, ref: dict, atol: float = 1e-6) -> None:
    for kind in HEAD_TYPES:
        np.testing.assert_allclose(r.scores[kind].numpy(), ref["scores"][kind], atol=atol, rtol=0)
        np.testing.assert_allclose(r.focus[kind].numpy(), ref["focus"][kind], atol=atol, rtol=0)
        assert abs(r.coverage[kind] - ref["coverage"][kind]) <= 1e-12


def _count_forwards(block) -> list:
    calls: list = []
    block.register_forward_pre_hook(lambda m, a: calls.append(1))
    return calls


# ------------------------------------------------------------------------------------------------
# our model
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attention_dir", ["causal", "bidirectional"])
def test_ours_equal_detect_head_and_the_naive_loop(attention_dir):
    model = _ours(attention_dir=attention_dir)
    rows = _prompts(LENGTHS, high=6)
    calls = _count_forwards(model.blocks[0])
    r = head_type_scores(model, _padded(rows), batch_size=3)
    assert len(calls) == r.n_forwards == math.ceil(len(rows) / 3)
    texts = [" ".join(str(int(t)) for t in row) for row in rows]
    for kind, name in TL_HEAD_NAMES.items():
        tl = hd.detect_head(_Detectable(model), texts, name)
        np.testing.assert_allclose(r.scores[kind].numpy(), tl.numpy(), atol=1e-6, rtol=0)
    _assert_equal(r, _naive(model, rows, _our_cache(model)), atol=1e-10)
    assert float(r.focus["induction"].max()) > 0.0 and r.coverage["induction"] > 0.2


def test_ours_exclusions_equal_detect_head():
    model = _ours(attention_dir="causal")
    rows = _prompts(LENGTHS, high=5, seed=3)
    texts = [" ".join(str(int(t)) for t in row) for row in rows]
    for no_bos, no_current in ((True, False), (False, True), (True, True)):
        r = head_type_scores(
            model, _padded(rows), exclude_bos=no_bos, exclude_current_token=no_current
        )
        assert (r.exclude_bos, r.exclude_current_token) == (no_bos, no_current)
        for kind, name in TL_HEAD_NAMES.items():
            tl = hd.detect_head(
                _Detectable(model),
                texts,
                name,
                exclude_bos=no_bos,
                exclude_current_token=no_current,
            )
            np.testing.assert_allclose(r.scores[kind].numpy(), tl.numpy(), atol=1e-6, rtol=0)


def test_padding_batching_and_the_early_stop_change_nothing():
    """More pad columns, another batch size, or the rows in one batch: the same numbers; a model
    scored (its forward stopped by an exception in a hook) gives the same logits after."""
    model = _ours(attention_dir="causal")
    rows = _prompts(LENGTHS, high=6, seed=1)
    tokens = _padded(rows)
    before = model(tokens)
    base = head_type_scores(model, tokens, batch_size=2)
    for other in (
        head_type_scores(model, _padded(rows, width=12), batch_size=2),
        head_type_scores(model, tokens, batch_size=len(rows)),
        head_type_scores(model, tokens, tokens != PAD, batch_size=1),
    ):
        for kind in HEAD_TYPES:
            torch.testing.assert_close(other.scores[kind], base.scores[kind], atol=1e-12, rtol=0)
            torch.testing.assert_close(other.focus[kind], base.focus[kind], atol=1e-12, rtol=0)
    torch.testing.assert_close(model(tokens), before, atol=0, rtol=0)
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())  # every hook removed


def test_bad_inputs_are_refused_in_one_line():
    model = _ours(attention_dir="causal")
    tokens = _padded(_prompts((4, 6), high=6))
    left = torch.flip(tokens, [1])
    with pytest.raises(ValueError, match="pad on the right"):
        head_type_scores(model, left)
    with pytest.raises(ValueError, match="batch_size"):
        head_type_scores(model, tokens, batch_size=0)
    with pytest.raises(ValueError, match="no head type 'sink'"):
        head_type_scores(model, tokens, thresholds={"sink": 0.3})
    with pytest.raises(ValueError, match=r"thresholds\['induction'\]"):
        head_type_scores(model, tokens, thresholds={"induction": 1.5})


# ------------------------------------------------------------------------------------------------
# a Llama bridge with grouped key/value heads
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    _, model, _ = sharp_bridge(
        "llama",
        LLAMA,
        seed=2,
        sharpen=4.0,
        out=tmp_path_factory.mktemp("hl") / "m",
        answers=[26, 27],
    )
    model.bridge.cfg.default_prepend_bos = False  # a prompt is its words, as our tokens are
    return model


def test_grouped_bridge_equals_detect_head_and_the_naive_loop(llama):
    bridge = llama.bridge
    assert llama.kv_layout.grouped
    rows = _prompts(LENGTHS, high=8, seed=2)
    texts = [" ".join(f"t{int(t)}" for t in row) for row in rows]
    assert all(torch.equal(bridge.to_tokens(t)[0], row) for t, row in zip(texts, rows))
    before = llama(_padded(rows))
    calls = _count_forwards(bridge.blocks[0])
    r = head_type_scores(bridge, _padded(rows), batch_size=4)  # the raw bridge, wrapped
    assert len(calls) == r.n_forwards == 2
    torch.testing.assert_close(llama(_padded(rows)), before, atol=0, rtol=0)  # after the stop
    for kind, name in TL_HEAD_NAMES.items():
        tl = hd.detect_head(bridge, texts, name)
        np.testing.assert_allclose(r.scores[kind].numpy(), tl.numpy(), atol=1e-6, rtol=0)

    def run_one(row):
        _, cache = bridge.run_with_cache(row[None])
        return [cache[f"blocks.{layer}.attn.hook_pattern"][0] for layer in range(LLAMA["n_layers"])]

    _assert_equal(r, _naive(llama, rows, run_one), atol=1e-6)
    again = head_type_scores(llama, _padded(rows, width=15), batch_size=7)
    assert again.n_forwards == 1
    for kind in HEAD_TYPES:
        torch.testing.assert_close(again.scores[kind], r.scores[kind], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# the result
# ------------------------------------------------------------------------------------------------
def test_result_types_top_summary_and_round_trip(tmp_path):
    model = _ours(attention_dir="causal")
    rows = _prompts(LENGTHS, high=6)
    r = head_type_scores(model, _padded(rows), thresholds={"induction": 0.0, "previous_token": 1.0})
    assert r.thresholds == {**DEFAULT_THRESHOLDS, "induction": 0.0, "previous_token": 1.0}
    assert r.shape == (2, 2) and r.n_examples == len(rows)
    types = r.types()
    assert sorted(types["induction"]) == [(la, h) for la in range(2) for h in range(2)]
    assert types["previous_token"] == []
    for kind in HEAD_TYPES:
        values = r.scores[kind].numpy()
        top = r.top(kind, 3)
        order = np.argsort(-values, axis=None, kind="stable")[:3]
        assert [lh for lh, _ in top] == [divmod(int(i), 2) for i in order]
        assert [v for _, v in top] == [float(values.flat[i]) for i in order]
        bar = r.thresholds[kind]
        typed = {(la, h) for la in range(2) for h in range(2) if r.focus[kind][la, h] >= bar}
        assert set(types[kind]) == typed
    assert "induction" in r.kinds_of(0, 0) and "previous_token" not in r.kinds_of(0, 0)
    assert r.previous_token is r.scores["previous_token"]
    text = r.summary()
    assert all(kind in text for kind in HEAD_TYPES) and "coverage" in text
    with pytest.raises(ValueError, match="head type must be one of"):
        r.top("sink")

    back = HeadTypeScores.load(r.save(tmp_path / "h.json"))
    for kind in HEAD_TYPES:
        torch.testing.assert_close(back.scores[kind], r.scores[kind], atol=0, rtol=0)
        torch.testing.assert_close(back.focus[kind], r.focus[kind], atol=0, rtol=0, equal_nan=True)
    assert (back.coverage, back.thresholds) == (r.coverage, r.thresholds)
    assert (back.n_examples, back.n_forwards, back.batch_size) == (
        r.n_examples,
        r.n_forwards,
        r.batch_size,
    )
    assert back.types() == types


def test_focus_is_nan_where_no_prompt_has_a_target(tmp_path):
    """Distinct tokens: no duplicate, no induction target; focus NaN, scores 0, and it saves."""
    model = _ours(attention_dir="causal")
    tokens = torch.stack([torch.randperm(19)[:9] + 1 for _ in range(3)])
    r = head_type_scores(model, tokens)
    for kind in ("duplicate_token", "induction"):
        assert bool(r.focus[kind].isnan().all()) and float(r.scores[kind].abs().max()) == 0.0
        assert r.coverage[kind] == 0.0 and r.types()[kind] == []
    back = HeadTypeScores.load(r.save(tmp_path / "h.json"))
    assert bool(back.focus["induction"].isnan().all())


def test_plot_has_a_panel_per_type(tmp_path):
    from probes.heads.view import plot_head_types

    r = head_type_scores(_ours(attention_dir="causal"), _padded(_prompts(LENGTHS, high=6)))
    fig = plot_head_types(r, tmp_path / "f" / "h.png")
    assert (tmp_path / "f" / "h.png").stat().st_size > 0
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title().split(" (")[0] for ax in panels] == [
        k.replace("_", " ") for k in HEAD_TYPES
    ]


# ------------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------------
def test_heads_command_on_a_saved_model_directory(tmp_path, capsys):
    from pe_interp.cli import main
    from pe_interp.models.bridge.hf_arch import build_hf_model, save_model_dir, word_tokenizer
    from pe_interp.runs.model_dirs import load_model_dir

    shape = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32, "n_ctx": 16}
    hf = build_hf_model("gpt-neox", seed=1, d_vocab=38, pad_id=0, **shape)
    saved = save_model_dir(hf, word_tokenizer(38, 0), tmp_path / "saved")
    run = tmp_path / "m"
    shutil.copytree(saved, run)
    argv = ["heads", str(run), "--task", "distance", "--preset", "smoke", "--n", "10"]
    assert main([*argv, "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert all(kind in out for kind in HEAD_TYPES) and "3 forwards" in out
    saved_r = HeadTypeScores.load(run / "head_types.json")
    assert (run / "figures" / "head_types.png").is_file()
    loaded = load_model_dir(run, "distance", "smoke")
    test = loaded.examples("test", 10)
    again = head_type_scores(loaded.model, test.tokens, test.pad_mask)
    assert saved_r.n_examples == 10 and saved_r.n_forwards == 3
    for kind in HEAD_TYPES:
        np.testing.assert_allclose(saved_r.scores[kind], again.scores[kind], atol=1e-9, rtol=0)


def _planted_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """``[n, q, k]`` one-hot patterns of each planted type from the tokens themselves: the previous
    token, the first token, the earlier copy of the query's token (duplicate) and the token after
    it (induction); a query with no target attends uniformly over its causal keys."""
    n, w = tokens.shape
    uniform = torch.tril(torch.ones(w, w, dtype=torch.float64))
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(n, w, w)
    out = {kind: uniform.clone() for kind in ("prev", "first", "dup", "ind")}
    for b in range(n):
        for q in range(w):
            earlier = [k for k in range(q) if tokens[b, k] == tokens[b, q]]
            targets = {"first": 0, "prev": q - 1 if q else None}
            targets["dup"] = earlier[-1] if earlier else None
            targets["ind"] = earlier[-1] + 1 if earlier else None
            for kind, k in targets.items():
                if k is not None:
                    out[kind][b, q] = 0.0
                    out[kind][b, q, k] = 1.0
    return out


def test_planted_patterns_are_typed_exactly():
    """Ground truth planted in the patterns (a hook that runs before the probe's reads): in a
    2-layer model of 4 heads, L0H1 previous-token, L0H2 first-token, L1H0 duplicate-token, L1H3
    induction, the other four heads uniform over their keys. Each planted head is of its type
    alone and at focus 1, and no other head is typed."""
    model = _ours(n_heads=4, d_model=16, n_ctx=16, attention_dir="causal")
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(12):  # a first token, 8 distinct tokens, the first 5 again
        body = torch.randperm(18, generator=g)[:8] + 2
        rows.append(torch.cat([torch.tensor([1]), body, body[:5]]))
    tokens = torch.stack(rows)
    planted = _planted_patterns(tokens)
    where = {(0, 1): "prev", (0, 2): "first", (1, 0): "dup", (1, 3): "ind"}

    def plant(pattern, hook):
        layer = int(hook.name.split(".")[1])
        out = torch.tril(torch.ones_like(pattern[0, 0]))
        out = (out / out.sum(-1, keepdim=True)).expand_as(pattern).clone()
        for (at, head), kind in where.items():
            if at == layer:
                out[:, head] = planted[kind].to(pattern.dtype)
        return out

    hooks = [(f"blocks.{layer}.attn.hook_pattern", plant) for layer in range(2)]
    with model.hooks(fwd_hooks=hooks):
        r = head_type_scores(model, tokens, pad_mask=torch.ones_like(tokens, dtype=torch.bool))
    assert r.types() == {
        "previous_token": [(0, 1)],
        "duplicate_token": [(1, 0)],
        "induction": [(1, 3)],
        "first_token": [(0, 2)],
    }
    named = {"prev": "previous_token", "first": "first_token", "dup": "duplicate_token"}
    named |= {"ind": "induction"}
    for (layer, head), kind in where.items():
        focus = r.focus[named[kind]][layer, head]
        assert float(focus) == pytest.approx(1.0, abs=1e-9), kind

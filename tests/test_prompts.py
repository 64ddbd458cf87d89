"""Positional prompt families in natural tokens (pe_interp.prompts): determinism, counterfactuals
as the probes read them, the batched accuracy against a naive loop, the JSONL reader, and the
one-line errors. A word-level tokenizer and a tiny Llama keep it fast; one test reads the real
SmolLM2 directory where it exists."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from prompt_env import make_tokenizer

from pe_interp.models.bridge.hf_arch import boot_bridge, build_hf_model, save_model_dir
from pe_interp.prompts import (
    FAMILIES,
    Induction,
    PromptSet,
    RecallByIndex,
    Successor,
    check_fits,
    context_limit,
    family_accuracy,
    load_jsonl,
    make_family,
    resolve_tokenizer,
)
from pe_interp.prompts.vocab import BosPolicy
from probes.common.inputs import position_permutation

SMOL = Path(os.path.expanduser("~/.cache/pe-interp/gguf/b179c9523d0e6a0f"))


TOK = make_tokenizer()
V = len(TOK)
N_CTX = 96


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama over TOK, its saved directory and its bridge."""
    hf = build_hf_model(
        "llama",
        seed=1,
        n_layers=2,
        d_model=32,
        n_heads=2,
        d_mlp=64,
        n_ctx=N_CTX,
        d_vocab=V,
        pad_id=0,
    )
    out = save_model_dir(hf, TOK, tmp_path_factory.mktemp("prompts") / "model")
    return hf, out, boot_bridge(out)


def families(tok=TOK):
    return [Induction(tok), Induction(tok, pool="ids"), RecallByIndex(tok), Successor(tok, shots=0)]


@pytest.mark.parametrize("family", families(), ids=repr)
def test_determinism_and_prefix(family):
    a, b = family.sample(12, seed=3), family.sample(12, seed=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, family.sample(12, seed=4).tokens)
    assert torch.equal(family.sample(5, seed=3).tokens, a.tokens[:5])
    assert a.bos == BosPolicy(True, 2, "<s>", "auto") and bool((a.tokens[:, 0] == 2).all())
    assert a.answer_lengths == (1,) * 12 and a.n_multi_token == 0
    # the answer is in the prompt (an item of the list), never the pad
    for row, label, mask in zip(a.tokens, a.labels, a.pad_mask, strict=True):
        assert int(label) in row[mask].tolist() and int(label) != a.pad_id
    for kind in ("position", "content"):
        p, q = family.counterfactuals(12, kind, seed=3), family.counterfactuals(12, kind, seed=3)
        assert torch.equal(p.corrupt.tokens, q.corrupt.tokens)
        assert torch.equal(p.clean.tokens, a.tokens)  # the clean rows are sample(n, seed)


@pytest.mark.parametrize("family", families(), ids=repr)
def test_counterfactuals_as_the_probes_read_them(family):
    pos = family.counterfactuals(16, "position", seed=0)
    sigma = position_permutation(pos.clean.tokens, pos.corrupt.tokens)  # raises unless permuted
    assert torch.equal(torch.gather(pos.corrupt.tokens, 1, sigma), pos.clean.tokens)
    assert bool((pos.clean.labels != pos.corrupt.labels).all())
    assert torch.equal(pos.clean.pad_mask, pos.corrupt.pad_mask)
    assert pos.changed.sum(1).tolist() == [2] * 16  # the answer swapped with one other item
    con = family.counterfactuals(16, "content", seed=0)
    assert bool((con.clean.labels != con.corrupt.labels).all())
    assert con.changed.sum(1).tolist() == [1] * 16  # one token, in place
    # the new answer is in no other slot of the row
    for row, label in zip(con.clean.tokens, con.corrupt.labels, strict=True):
        assert int(label) not in row.tolist()
    assert len(con.counterfactual_pairs) == 16


def test_family_fields_and_pools():
    fam = Induction(TOK, n_random=8, n_repeat=3)
    ps = fam.sample(4)
    assert ps.tokens.shape == (4, 1 + 8 + 3)
    assert torch.equal(ps.tokens[:, 1:4], ps.tokens[:, 9:12])
    assert torch.equal(ps.labels, ps.tokens[:, 4])
    assert fam.pool_used == "single-token words"
    ids = Induction(TOK, pool="ids")
    assert set(ids.items_pool) == set(range(3, V))  # every id but [PAD], [UNK], <s>
    assert make_family("recall", TOK, n_list=4).n_items == 4 and set(FAMILIES) == {
        "induction",
        "recall",
        "successor",
    }
    nobos = RecallByIndex(make_tokenizer(bos=False), shots=0).sample(3)
    assert not nobos.bos.prepended and "no BOS (tokenizer has none)" in nobos.describe()
    assert RecallByIndex(TOK, bos=False).sample(2).bos.describe() == "no BOS (off)"
    text = RecallByIndex(TOK, shots=0).sample(1).texts[0]
    assert text.startswith("List: ") and " item in the list is" in text
    for bad, line in [
        (lambda: Induction(TOK, n_random=7, n_repeat=6), "n_random must be an integer >= 8"),
        (lambda: RecallByIndex(TOK, n_list=11), "n_list must be an integer in [2, 10]"),
        (lambda: Successor(TOK, n_list=2), "n_list must be an integer >= 3"),
        (lambda: Induction(TOK, n_random=45), "the tokenizer has only 40 single-token words"),
        (lambda: Induction(TOK, pool="nouns"), "pool must be one of"),
        (
            lambda: (
                Induction(TOK, bos=True).sample(1)
                and Induction(make_tokenizer(False), bos=True).sample(1)
            ),
            "no BOS token",
        ),
        (lambda: make_family("sort", TOK), "unknown prompt family 'sort'"),
        (lambda: Induction(TOK).counterfactuals(4, kind="both"), "kind must be one of"),
    ]:
        with pytest.raises(ValueError) as err:
            bad()
        assert line in str(err.value) and "\n" not in str(err.value)


def _naive(hf, prompts: PromptSet) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for row, mask in zip(prompts.tokens, prompts.pad_mask, strict=True):
            out.append(int(hf(input_ids=row[mask][None]).logits[0, -1].argmax()))
    return torch.tensor(out)


def test_family_accuracy_equals_a_naive_loop(tiny, tmp_path):
    from pe_interp.models.bridge.model import BridgedModel

    hf, _, bridge = tiny
    lines = [
        {"prompt": "List: apple , bag . The first item in the list is", "answer": " apple"},
        {"prompt": "Paris is the capital of", "answer": " France"},
        {"prompt": "List: apple", "answer": " bag ball"},  # multi-token
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    mine = load_jsonl(path, TOK).prompts
    for prompts in [f.sample(10, seed=1) for f in families()] + [mine]:
        naive = _naive(hf, prompts)
        for model in (hf, bridge, BridgedModel(bridge)):
            result = family_accuracy(model, prompts, batch_size=4)
            assert torch.equal(result.predictions, naive)
            assert result.correct == int((naive == prompts.labels).sum()) and result.n == len(
                prompts
            )
    result = family_accuracy(hf, mine)
    assert 0.0 <= result.accuracy <= 1.0
    assert "answers scored on their first token (1 of 3 are multi-token)" in result.summary()
    assert "BOS '<s>' (id 2) prepended" in result.summary()
    assert result.to_dict()["scored_on_first_token"] is True


def test_route_shares_reads_the_pairs(tiny):
    import probes
    from pe_interp.models.bridge.model import BridgedModel

    _, _, bridge = tiny
    pairs = Induction(TOK, n_random=6, n_repeat=2).counterfactuals(4, "position", seed=0)
    shares = probes.route_shares(
        BridgedModel(bridge),
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.pad_mask,
        n_bootstrap=0,
    )
    assert shares is not None


def test_jsonl_reader(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "List: apple , bag . The first item in the list is", "answer": " apple",
         "counterfactual_prompt": "List: bag , apple . The first item in the list is",
         "counterfactual_answer": " bag"},
        {"prompt": "Paris is the capital of", "answer": " France"},
        {"prompt": "List: cat , desk . The second item in the list is", "answer": " desk",
         "counterfactual_prompt": "List: desk , cat . The second item in the list is",
         "counterfactual_answer": " cat"},
    ]  # fmt: skip
    path.write_text(json.dumps(rows[0]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[1:]))
    read = load_jsonl(path, TOK, family="mine")
    ps = read.prompts
    assert len(ps) == 3 and ps.family == "mine" and ps.answers[1] == " France"
    assert ps.labels.tolist() == [TOK.convert_tokens_to_ids(w) for w in ("apple", "France", "desk")]
    assert bool(ps.pad_mask[1].sum() < ps.pad_mask[0].sum()) and ps.pad_id == 0  # right-padded
    assert read.pair_lines == (1, 4) and read.counterfactuals.kind == "position"
    pairs = read.counterfactuals
    position_permutation(pairs.clean.tokens, pairs.corrupt.tokens)
    assert pairs.corrupt.answers == (" bag", " cat")
    content = tmp_path / "content.jsonl"
    cf = {"counterfactual_prompt": "apple is the capital of", "counterfactual_answer": " bag"}
    content.write_text(json.dumps({**rows[1], **cf}))
    assert load_jsonl(content, TOK).counterfactuals.kind == "content"


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "a line must be a JSON object, got list"),
    ('{"prompt": "List: apple"}', "missing field 'answer'"),
    ('{"answer": " apple"}', "missing field 'prompt'"),
    ('{"prompt": "List:", "answer": " apple", "label": 3}', "unknown field 'label'"),
    ('{"prompt": "List:", "answer": 3}', "answer must be a string, got int"),
    ('{"prompt": "List:", "answer": ""}', "answer '' tokenizes to no token"),
    ('{"prompt": "", "answer": " apple"}', "prompt tokenizes to no token"),
    ('{"prompt": "List:", "answer": " zebra"}', "answer ' zebra' is not in the vocabulary"),
    ('{"prompt": "List: [PAD]", "answer": " apple"}', "prompt holds the pad token (id 0)"),
    (
        '{"prompt": "List:", "answer": " apple", "counterfactual_prompt": "List:"}',
        "counterfactual_prompt without counterfactual_answer",
    ),
    (
        '{"prompt": "List: apple", "answer": " bag", "counterfactual_prompt": "List:", '
        '"counterfactual_answer": " cat"}',
        "counterfactual_prompt has 1 tokens and prompt 2",
    ),
    (
        '{"prompt": "List: apple", "answer": " bag", "counterfactual_prompt": "List: cat", '
        '"counterfactual_answer": " bag"}',
        "a counterfactual must change the answer",
    ),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_jsonl_bad_lines(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "List: apple", "answer": " bag"}\n' + line + "\n")
    with pytest.raises(ValueError) as err:
        load_jsonl(path, TOK)
    text = str(err.value)
    assert message in text and "\n" not in text
    assert text.startswith(f"{path}:2: ")  # the file and the line


def test_too_long_and_outside_vocabulary(tiny, tmp_path):
    hf, out, bridge = tiny
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "List: apple , bag , cat", "answer": " desk"}\n')
    for config, what in [
        (SimpleNamespace(max_position_embeddings=5, vocab_size=V), "context (max_position_embeddings) of 5"),
        (SimpleNamespace(n_positions=64, sliding_window=4, vocab_size=V), "sliding window (sliding_window) of 4"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match="has 7 tokens with BOS, more than the model's") as err:
            load_jsonl(path, TOK, model=config)
        assert what in str(err.value)
    assert context_limit(SimpleNamespace(n_positions=64, sliding_window=4, use_sliding_window=False)) == (
        64,
        "context (n_positions)",
    )  # fmt: skip
    assert context_limit(out) == (N_CTX, "context (max_position_embeddings)")
    assert context_limit(bridge)[0] == N_CTX
    long = Induction(TOK, n_random=36, n_repeat=34, pool="ids").sample(2)  # 71 tokens
    check_fits(hf, long)
    for model in (SimpleNamespace(max_position_embeddings=60), SimpleNamespace(sliding_window=60)):
        with pytest.raises(
            ValueError, match="prompts of up to 71 tokens are longer than the model's"
        ):
            check_fits(model, long)
    longer = Induction(TOK, n_random=50, n_repeat=47, pool="ids").sample(2)  # 98 tokens
    for model in (hf, bridge):
        with pytest.raises(
            ValueError, match=f"98 tokens are longer than the model's context .* of {N_CTX}"
        ):
            family_accuracy(model, longer)
    big = SimpleNamespace(max_position_embeddings=100, vocab_size=10)
    with pytest.raises(ValueError, match="outside the model's vocabulary \\(10\\)"):
        check_fits(big, Induction(TOK).sample(2))
    with pytest.raises(ValueError, match="outside the model's vocabulary \\(10\\)"):
        load_jsonl(path, TOK, model=big)


def test_padding_pad_ids_and_models(tiny):
    from pe_interp.models.bridge.model import BridgedModel

    hf, _, bridge = tiny
    ps = Induction(TOK).sample(2)
    tokens, mask = ps.tokens.clone(), ps.pad_mask.clone()
    tokens[0] = torch.roll(tokens[0], 1)
    tokens[0, 0], mask[0, 0] = ps.pad_id, False
    with pytest.raises(ValueError, match="row 0 is padded on the left"):
        PromptSet("x", tokens, ps.labels, mask, ps.answers, ps.answer_lengths, ps.bos, ps.pad_id)
    with pytest.raises(ValueError, match="without answers"):
        family_accuracy(BridgedModel(bridge, answers=[3, 4]), ps)
    with pytest.raises(ValueError, match="takes a TransformerBridge, a BridgedModel"):
        family_accuracy(object(), ps)
    # a tokenizer without a pad token pads with EOS, or an id no prompt holds
    nopad = make_tokenizer()
    nopad.pad_token = None
    assert nopad.pad_token_id is None
    padded = load_from_lines(nopad, ["List: apple", "List: apple , bag , cat"])
    assert padded.pad_id == 0 and "no pad token" in padded.pad_source  # [PAD] is in no prompt
    with pytest.raises(
        ValueError, match="build it as BridgedModel\\(bridge, pad_id=prompts.pad_id\\)"
    ):
        family_accuracy(BridgedModel(bridge, pad_id=5), padded)


def load_from_lines(tok, prompts: list[str]) -> PromptSet:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.jsonl"
        path.write_text("\n".join(json.dumps({"prompt": p, "answer": " desk"}) for p in prompts))
        return load_jsonl(path, tok).prompts


def test_model_without_tokenizer(tmp_path):
    hf = build_hf_model(
        "llama", seed=0, n_layers=1, d_model=16, n_heads=2, d_mlp=32, n_ctx=16, d_vocab=V, pad_id=0
    )
    hf.save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="the model has no tokenizer that loads") as err:
        resolve_tokenizer(tmp_path / "bare")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="the model \\(SimpleNamespace\\) has no tokenizer"):
        resolve_tokenizer(SimpleNamespace(tokenizer=None))


@pytest.mark.skipif(not (SMOL / "config.json").is_file(), reason=f"no SmolLM2 directory at {SMOL}")
def test_smollm2_accuracy_per_family():
    """The real model: every family's accuracy is a fraction, and the prompts fit it."""
    from transformers import AutoModelForCausalLM

    tok = resolve_tokenizer(SMOL)
    hf = AutoModelForCausalLM.from_pretrained(str(SMOL)).eval()
    for fam in (Induction(tok), RecallByIndex(tok, shots=0), Successor(tok, shots=0)):
        result = family_accuracy(hf, fam.sample(32, seed=0))
        print(result.summary())
        assert 0.0 <= result.accuracy <= 1.0 and result.n == 32
        pairs = fam.counterfactuals(4, "position", seed=0)
        position_permutation(pairs.clean.tokens, pairs.corrupt.tokens)

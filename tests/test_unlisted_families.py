"""Families no code names, tried as a user would: ``pe-interp circuit`` on a tiny GPT-J, Falcon
(multi-query, parallel attention and MLP) and OLMo (version 1: a LayerNorm without weight or bias)
either runs or refuses in one line, and each refusal names what the model lacks (issue 55: "any
command on any model either runs or refuses in one line; an internal error is a bug"). Before:
GPT-J's bridge raised NotImplementedError at its q/k/v forks, Falcon's attention had no
``scaling`` to read, and OLMo's parameter-free norm failed inside the bridge once a hook froze its
scale; all three were internal errors.

The references: Falcon's scale is held to its own scores (``hook_attn_scores`` equal to scale x
q . k, which the logit decomposition's check asserts); OLMo's deeper layer still decomposes to
its scores."""

from __future__ import annotations

import pytest
import torch
import transformers
from prompt_env import make_tokenizer

from pe_interp.cli import main
from pe_interp.models.bridge.hf_arch import save_model_dir

TOK = make_tokenizer()
V = len(TOK)
SHAPE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "gptj": lambda: transformers.GPTJConfig(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=96, rotary_dim=4
    ),
    "falcon": lambda: transformers.FalconConfig(
        **SHAPE, new_decoder_architecture=False, multi_query=True, parallel_attn=True
    ),
    "olmo": lambda: transformers.OlmoConfig(
        **SHAPE, intermediate_size=64, num_key_value_heads=2, max_position_embeddings=96
    ),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root, out = tmp_path_factory.mktemp("unlisted"), {}
    for name, config in CONFIGS.items():
        cfg = config()
        cfg.pad_token_id = 0
        torch.manual_seed(5)
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for w in hf.parameters():
                if w.dim() == 2:
                    w.copy_(torch.randn(w.shape, generator=g) * 0.3)
        out[name] = save_model_dir(hf.eval(), TOK, root / name)
    return out


def _circuit(model_dir, tmp_path, capsys) -> tuple[int, list[str]]:
    argv = ["circuit", str(model_dir), "--task", "induction", "--preset", "smoke", "--n", "8"]
    rc = main([*argv, "--faithful", "0.9", "--no-progress", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    return rc, [line for line in err.splitlines() if line.strip()]


def test_gpt_j_refuses_edges_in_one_line_naming_its_missing_forks(model_dirs, tmp_path, capsys):
    rc, lines = _circuit(model_dirs["gptj"], tmp_path, capsys)
    assert rc == 2 and len(lines) == 1, lines
    assert "the bridge has no per-head q/k/v input forks for its attention" in lines[0]
    assert "internal error" not in lines[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["falcon", "olmo"])
def test_falcon_and_olmo_write_their_circuit(model_dirs, family, tmp_path, capsys):
    from probes import Circuit

    rc, lines = _circuit(model_dirs[family], tmp_path, capsys)
    assert rc == 0 and lines == [], lines
    c = Circuit.load(tmp_path / "out" / "circuit.json")
    assert c.positional and len(c.edges) > 0 and c.faithfulness["kept"] >= 0.9 - 1e-9


def test_falcons_scale_is_its_scores_and_olmos_layer_0_says_why_it_cannot_freeze(model_dirs):
    from pe_interp.runs.model_dirs import load_model_dir
    from probes import logit_terms

    loaded = load_model_dir(model_dirs["falcon"], task="induction", preset="smoke")
    falcon = loaded.model
    olmo = load_model_dir(model_dirs["olmo"], task="induction", preset="smoke").model
    tokens = loaded.task.counterfactuals(2, kind="position", seed=0).clean.tokens
    assert falcon.attention_scale(0) == pytest.approx(8**-0.5, rel=1e-12)  # d_head 8
    for layer in (0, 1):  # every term of the logits, summed, is the bridge's own scores
        assert logit_terms(falcon, tokens, layer, 1, example=0).check() < 1e-4
    assert olmo.encoding.unfrozen_norms(0) == [
        "ln1: parameter-free, and the bridge cannot run it with its scale edited"
    ]
    with pytest.raises(ValueError, match=r"^logit_terms: olmo: .*ln1: parameter-free") as err:
        logit_terms(olmo, tokens, 0, 1, example=0)
    assert "\n" not in str(err.value)
    assert logit_terms(olmo, tokens, 1, 1, example=0).check() < 1e-4  # deeper layers decompose

"""A pretrained model read on natural prompts by the commands (``--task induction``, ``--task
FILE.jsonl``; pe_interp.prompts.task): the accuracy line comes first, the numbers equal a naive
hook loop or the probe called on the family's own prompts, the prompts are recorded with the
result, and bad input is one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bad_input_env import expect_cli_refusal
from prompt_env import make_tokenizer

from pe_interp.cli import main
from pe_interp.models.bridge.hf_arch import boot_bridge, build_hf_model, save_model_dir
from pe_interp.prompts import family_accuracy, make_family
from pe_interp.prompts.task import PROMPT_COUNTS, PromptTask, is_prompt_task
from pe_interp.runs.model_dirs import load_model_dir

TOK = make_tokenizer()
QUIET = ["--no-progress", "--no-figures"]


def _model_dir(root: Path, n_ctx: int = 96, tokenizer=TOK, n_kv_heads: int = 2) -> Path:
    hf = build_hf_model(
        "llama",
        seed=3,
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        d_mlp=64,
        n_ctx=n_ctx,
        d_vocab=len(TOK),
        pad_id=0,
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # larger weights than the default init: logits that differ by prompt
        for weight in hf.parameters():
            if weight.dim() == 2:
                weight.copy_(torch.randn(weight.shape, generator=gen) * 0.3)
    return save_model_dir(hf, tokenizer, root)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return _model_dir(tmp_path_factory.mktemp("prompt_runs") / "model")


def _last_logits(bridge, tokens, mask, hook=None) -> torch.Tensor:
    """The bridge's next-token logits at each row's last real token, one prompt at a time."""
    rows = []
    for ids, m in zip(tokens, mask, strict=True):
        real = ids[m][None]
        hooks = [] if hook is None else [hook]
        with torch.no_grad():
            rows.append(bridge.run_with_hooks(real, fwd_hooks=hooks)[0, -1])
    return torch.stack(rows)


def test_is_prompt_task():
    assert is_prompt_task("induction") and is_prompt_task("mine.jsonl")
    assert not is_prompt_task("distance") and not is_prompt_task(None)


def test_ablate_on_a_family_equals_a_naive_hook_z_loop(model_dir, capsys):
    argv = ["ablate", str(model_dir), "--task", "induction", "--metric", "loss", *QUIET]
    assert main([*argv, "--n-bootstrap", "40"]) == 0
    out = capsys.readouterr().out.splitlines()
    run = load_model_dir(model_dir, "induction")
    assert out[0] == f"{model_dir}: {run.config['accuracy']['summary']}"
    accuracy = run.config["accuracy"]["accuracy"]
    assert out[0].endswith(f"correct ({accuracy:.3f}); BOS '<s>' (id 2) prepended")
    saved = json.loads((model_dir / "ablation.json").read_text())
    assert saved["weights"]["source"] == {"weights": "model.safetensors"}
    assert saved["weights"]["sha256"] == run.provenance["sha256"]

    prompts = make_family("induction", TOK).sample(PROMPT_COUNTS["quick"], seed=0)
    assert torch.equal(run.task.prompts.tokens, prompts.tokens)
    bridge = boot_bridge(model_dir)
    labels = prompts.labels
    clean = F.cross_entropy(_last_logits(bridge, prompts.tokens, prompts.pad_mask), labels)
    assert saved["baseline"] == pytest.approx(float(clean), abs=1e-5)
    values = np.array(saved["values"])
    for layer in range(2):
        for head in range(4):

            def zero(z, hook, head=head):
                z[:, :, head] = 0.0
                return z

            hook = (f"blocks.{layer}.attn.hook_z", zero)
            logits = _last_logits(bridge, prompts.tokens, prompts.pad_mask, hook)
            naive = float(F.cross_entropy(logits, labels))
            assert values[layer, head] == pytest.approx(naive, abs=1e-5), (layer, head)


def test_the_accuracy_line_equals_family_accuracy(model_dir):
    run = load_model_dir(model_dir, "successor", preset="smoke", seed=4)
    prompts = make_family("successor", TOK).sample(PROMPT_COUNTS["smoke"], seed=4)
    expected = family_accuracy(boot_bridge(model_dir), prompts)
    assert run.config["accuracy"]["summary"] == expected.summary()
    assert run.config["task"]["n"] == 16 and run.config["task"]["seed"] == 4
    assert (
        run.config["task"]["bos"]["prepended"] and not run.config["task"]["scored_on_first_token"]
    )
    assert isinstance(run.task, PromptTask) and run.model.cfg.n_classes == len(TOK)
    test = run.examples("test", 5)
    assert torch.equal(test.tokens, prompts.tokens[:5]) and torch.equal(
        test.labels, prompts.labels[:5]
    )
    both = run.examples("all")
    assert torch.equal(both.tokens, prompts.tokens)  # no training split


def test_routes_and_patch_read_the_family_pairs(model_dir, capsys):
    from probes.deposit.trajectory import PAIRS_SEED_OFFSET
    from probes.patching.sweep import patch
    from probes.routes.shares import route_shares

    assert main(
        ["routes", str(model_dir), "--task", "recall", "--n", "24", "--n-bootstrap", "40"]
    ) in (0, 3)
    run = load_model_dir(model_dir, "recall")
    pairs = run.task.prompt_pairs(24, "position", seed=PAIRS_SEED_OFFSET)
    assert pairs.kind == "position" and bool((pairs.clean.labels != pairs.corrupt.labels).all())
    direct = route_shares(
        run.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.pad_mask,
        n_bootstrap=40,
        seed=0,
    )
    saved = json.loads((model_dir / "routes.json").read_text())
    assert abs(direct.effect) > 1e-3  # the pairs move the answer's logit
    assert saved["effect"] == pytest.approx(direct.effect, abs=1e-6)
    assert saved["weights"]["source"] == {"weights": "model.safetensors"}

    assert main(["patch", str(model_dir), "--task", "successor", "--n", "12", "--no-figures"]) == 0
    run = load_model_dir(model_dir, "successor")
    pairs = run.task.counterfactual_pairs(12, seed=0)
    direct = patch(
        run.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        clean_labels=pairs.clean.labels,
        corrupt_labels=pairs.corrupt.labels,
        pad_mask=pairs.clean.pad_mask,
        n_bootstrap=0,
    )
    saved = json.loads((model_dir / "patching.json").read_text())
    assert saved["pairs"]["task"]["name"] == "successor"
    assert np.allclose(np.array(saved["values"], dtype=float), direct.values, atol=1e-5)
    capsys.readouterr()


def test_a_prompts_file_is_a_task(model_dir, tmp_path, capsys):
    lines = [
        {"prompt": "apple bag cat apple bag", "answer": " cat",
         "counterfactual_prompt": "apple cat bag apple cat", "counterfactual_answer": " bag"},
        {"prompt": "desk coin desk", "answer": " coin"},
    ]  # fmt: skip
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    argv = ["ablate", str(model_dir), "--task", str(path), "--n-bootstrap", "0", *QUIET]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{model_dir}: mine: ") and "of 2 correct" in first
    run = load_model_dir(model_dir, str(path))
    assert run.task.name == "mine" and run.config["task"]["kind"] == "prompts file"
    pairs = run.task.counterfactuals(5)
    assert len(pairs) == 1 and pairs.clean.labels.tolist() == [TOK.convert_tokens_to_ids("cat")]
    assert not out.exists()


def _no_tokenizer_dir(root: Path) -> Path:
    out = _model_dir(root)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)
    return out


def _bert_dir(root: Path) -> Path:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=len(TOK), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64,
    )  # fmt: skip
    BertForMaskedLM(config).save_pretrained(root)
    TOK.save_pretrained(root)
    return root


@pytest.mark.parametrize("case,argv,pattern", [
    ("file", ["ablate", "{d}", "--task", "{t}/absent.jsonl"], r"absent.jsonl: no such prompts file"),
    ("preset", ["ablate", "{d}", "--task", "induction", "--preset", "huge"],
     r"--preset must be one of smoke, quick, mid, paper for prompts; got 'huge'"),
    ("short", ["ablate", "{s}", "--task", "induction"],
     r"induction: prompts of up to 19 tokens are longer than the model's context"),
    ("tokenizer", ["routes", "{n}", "--task", "induction"], r"the model has no tokenizer"),
    ("encoder", ["ablate", "{b}", "--task", "induction"],
     r"bert: BertForMaskedLM is not a causal language model \(an encoder-only or masked model"),
])  # fmt: skip
def test_bad_prompt_input_is_one_line_and_writes_nothing(tmp_path, case, argv, pattern, capsys):
    dirs = {"d": tmp_path / "model", "s": tmp_path / "short", "n": tmp_path / "bare"}
    dirs["b"] = tmp_path / "bert"
    _bert_dir(dirs["b"]) if case == "encoder" else None
    _model_dir(dirs["d"]) if case in ("file", "preset") else None
    _model_dir(dirs["s"], n_ctx=16) if case == "short" else None
    _no_tokenizer_dir(dirs["n"]) if case == "tokenizer" else None
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    capsys.readouterr()  # the models' saving
    expect_cli_refusal([a.format(t=tmp_path, **dirs) for a in argv], pattern, capsys)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_model_too_large_for_memory_is_refused_before_the_boot(tmp_path, monkeypatch, capsys):
    """The parameters are read from the safetensors header (as the safetensors library itself
    reads the shapes), and a model whose fp32 weights would not fit is refused in one line before
    transformers loads anything; nothing is written."""
    from safetensors import safe_open

    import pe_interp.models.bridge.hf_arch as hf_arch
    import pe_interp.runs.weights as md

    d = _model_dir(tmp_path / "model")
    weights = d / "model.safetensors"
    with safe_open(weights, "pt") as f:
        want = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118 (safe_open is not iterable)
    assert md.weight_count(weights) == want > 1000
    monkeypatch.setattr(md, "available_memory", lambda: 1 << 20)
    monkeypatch.setattr(hf_arch, "boot_bridge", lambda *a, **k: pytest.fail("booted"))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    capsys.readouterr()
    expect_cli_refusal(
        ["ablate", str(d), "--task", "induction"],
        rf"model: booting it needs about 1\.0 GiB of memory \({want / 1e6:.1f}M parameters in "
        r"fp32, 0\.00 GiB\), and 0\.0 GiB is available",
        capsys,
    )
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_sharded_model_loads_and_counts_every_shard(tmp_path):
    """A directory saved in shards (``model.safetensors.index.json``): the memory estimate counts
    the parameters of every shard (the unsharded file's count), the provenance hashes the shards,
    and the model scores its prompts as the unsharded one does."""
    import shutil

    from transformers import AutoModelForCausalLM

    import pe_interp.runs.weights as md

    one = _model_dir(tmp_path / "one")
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(one).save_pretrained(sharded, max_shard_size="20KB")
    for f in one.glob("*token*"):
        shutil.copy(f, sharded / f.name)
    index = sharded / "model.safetensors.index.json"
    files = md.weight_files(index)
    assert len(files) > 1 and not (sharded / "model.safetensors").exists()
    assert sum(md.weight_count(f) for f in files) == md.weight_count(one / "model.safetensors")
    a, b = load_model_dir(one, "induction"), load_model_dir(sharded, "induction")
    assert b.provenance["source"]["weights"] == index.name
    assert a.config["accuracy"] == b.config["accuracy"]
    files[-1].unlink()
    with pytest.raises(md.CheckpointError, match=rf"the shard {files[-1].name} is missing"):
        load_model_dir(sharded, "induction")


def test_circuit_on_natural_prompts_runs_per_span_or_on_whole_edges(
    model_dir, tmp_path, capsys, monkeypatch
):
    """``pe-interp circuit MODEL --task induction`` (issues 54, 55): a family's edges are kept per
    named span (a prompts file has none: refused before the model loads); with whole edges a
    grouped model (k/v readers per key/value head) and an ungrouped one write their circuits."""
    loads = []
    monkeypatch.setattr(
        "pe_interp.models.bridge.hf_arch.boot_bridge", lambda *a, **k: loads.append(a) or 1 / 0
    )
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "desk coin desk", "answer": " coin"}) + "\n")
    out = tmp_path / "spans"
    argv = ["circuit", str(model_dir), "--task", str(path), "--n", "6", "--out", str(out)]
    expect_cli_refusal(argv, r"prompts file names no spans.*pass --whole-edges", capsys)
    assert not loads and not out.exists()
    monkeypatch.undo()

    out = tmp_path / "aligned"  # σ-aligned, per span of the induction layout
    argv = ["circuit", str(model_dir), "--task", "induction", "--n", "6", "--aligned"]
    assert main([*argv, "--method", "atp", "--faithful", "0.9", "--out", str(out)]) == 0
    saved = json.loads((out / "circuit.json").read_text())
    names = make_family("induction", TOK).span_names
    faith = saved["faithfulness"]
    assert saved["span_names"] == list(names) and len(saved["edges"]) == faith["prefix"]
    assert set(saved["spans"]) <= set(names) and saved["meta"]["aligned"] and faith["aligned"]
    assert faith["kept"] >= 0.9 and saved["meta"]["held_out_seed"] == 1

    out = tmp_path / "grouped"  # 4 query heads on 2 key/value heads: k/v readers per key/value head
    argv = ["circuit", str(model_dir), "--task", "induction", "--n", "6", "--whole-edges"]
    assert main([*argv, "--top-n", "40", "--out", str(out)]) == 0
    saved = json.loads((out / "circuit.json").read_text())
    readers = {r for _, r in saved["edges"]}
    assert len(saved["edges"]) == 40 and any("KV" in r for r in readers), readers
    assert not any(r.endswith((".k", ".v")) and "KV" not in r for r in readers)
    route = saved["meta"]["route"]["exact"]["position"]
    assert set(route) == {"q", "k", "v"} and all(route[c] for c in "qkv")

    plain = _model_dir(tmp_path / "plain", n_kv_heads=4)
    out = tmp_path / "circuit"
    argv = ["circuit", str(plain), "--task", "induction", "--n", "6", "--whole-edges"]
    assert main([*argv, "--top-n", "5", "--out", str(out)]) == 0
    saved = json.loads((out / "circuit.json").read_text())
    assert len(saved["edges"]) == 5 and saved["spans"] is None
    assert saved["meta"]["top_head"].startswith("L") and saved["weights"]["sha256"]
    assert (out / "circuit.html").read_text().count("<table") >= 2


def test_a_circuit_of_rows_with_no_one_layout_is_refused_before_a_forward(model_dir, monkeypatch):
    """Recall whose questions differ in length has no one layout to name spans of: the circuit
    refuses in one line before its first forward (with whole edges it needs none)."""
    import dataclasses
    from functools import cached_property

    from pe_interp.commands.circuit import circuit_run
    from pe_interp.prompts import RecallByIndex

    class Uneven(RecallByIndex):
        @cached_property
        def _questions(self) -> list[list[int]]:
            qs = [list(q) for q in super()._questions]
            return [qs[0] + qs[0][-1:], *qs[1:]]

    run = load_model_dir(model_dir, "recall")
    task = dataclasses.replace(run.task, family=Uneven(TOK))
    monkeypatch.setattr(run.model, "forward_unchecked", lambda *a, **k: 1 / 0)
    with pytest.raises(ValueError, match=r"^recall: its questions are 7 to 8 tokens long"):
        circuit_run(run.model, task, run, n=4)

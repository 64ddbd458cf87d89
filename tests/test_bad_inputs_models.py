"""Hostile inputs to the commands that read real models (issue 54): a saved Hugging Face
directory, a GGUF file, a prompts file, the survey. Each refusal is one line (exit 2, no
traceback), comes before the first forward (:func:`forwards` counts every module's forward,
without a clock) and writes nothing; each case that now works is shown to work."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from bad_input_env import TINY, expect_cli_refusal
from prompt_env import make_tokenizer

import pe_interp
import pe_interp.util.io as io
from pe_interp.cli import main
from pe_interp.models.bridge.hf_arch import build_hf_model, save_model_dir

TOK = make_tokenizer()


def tiny_model(root: Path, seed: int = 5) -> Path:
    """A 2-layer Llama over the prompt templates' words, saved with its tokenizer."""
    hf = build_hf_model(
        "llama", seed=seed, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_mlp=64,
        n_ctx=96, d_vocab=len(TOK), pad_id=0,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in hf.parameters():
            if weight.dim() == 2:
                weight.copy_(torch.randn(weight.shape, generator=gen) * 0.3)
    return save_model_dir(hf, TOK, root)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("bad-models") / "model")


@pytest.fixture
def model_copy(model, tmp_path) -> Path:
    """A copy of the tiny model that a case may break or lock."""
    return Path(shutil.copytree(model, tmp_path / "model"))


class Forwards(list):
    """The module forwards that ran, by module type; ``checks``: those of the causality check's
    miniature (:func:`pe_interp.runs.causal.check_attends_causally`: a one-layer copy built
    from the config, random weights), which is a check, not a forward of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.checks: list[str] = []


@pytest.fixture
def forwards():
    """Every module forward that runs while the test does (global hooks), the miniature's apart."""
    from pe_interp.runs.causal import MINIATURE_FLAG

    calls, depth = Forwards(), [0]

    def before(module, args):
        if getattr(module, MINIATURE_FLAG, False):
            depth[0] += 1
        (calls.checks if depth[0] else calls).append(type(module).__name__)

    def after(module, args, output):
        if getattr(module, MINIATURE_FLAG, False):
            depth[0] -= 1

    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(before),
        torch.nn.modules.module.register_module_forward_hook(after),
    ]
    yield calls
    for handle in hooks:
        handle.remove()


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(dir)``: ``dir`` (and what is under it) made read-only: its mode 0555, and where
    the tests run as root, whom the mode does not bind, the write check told so as well. The
    mode is restored afterwards, so that the directory can be removed."""
    locked: list[Path] = []
    real = io.writable

    def lock(directory: Path) -> Path:
        directory.chmod(0o555)
        locked.append(directory.resolve())
        return directory

    def writable(path: Path) -> bool:
        here = Path(path).resolve()
        if any(here == d or d in here.parents for d in locked):
            return False
        return real(path)

    if os.geteuid() == 0:
        monkeypatch.setattr(io, "writable", writable)
    yield lock
    for d in locked:
        d.chmod(0o755)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ------------------------------------------------------------------------------------------------
# a destination that cannot be written, checked before the work
# ------------------------------------------------------------------------------------------------
def test_ablate_into_a_read_only_model_directory_is_refused_before_loading(
    model_copy, read_only, forwards, capsys
):
    read_only(model_copy)
    before = files_under(model_copy)
    expect_cli_refusal(
        ["ablate", str(model_copy), "--task", "induction", "--no-figures", "--no-progress"],
        rf"error: {model_copy}: cannot write there \(not writable by this user\); make it "
        r"writable, or copy the run \(or model directory\) where you can write$",
        capsys,
    )
    assert not forwards and files_under(model_copy) == before


def test_ablate_on_a_read_only_run_directory_is_refused_before_loading(
    tmp_path, read_only, forwards, capsys
):
    run = tmp_path / "run"
    pe_interp.train(out=run, progress=False, **TINY)
    read_only(run)
    before = files_under(run)
    forwards.clear()
    expect_cli_refusal(
        ["ablate", str(run), "--no-figures", "--no-progress"],
        rf"error: {run}: cannot write there \(not writable by this user\)",
        capsys,
    )
    expect_cli_refusal(
        ["patch", f"{run}@1"],
        rf"error: {run}@1: its results go to {run}/steps/1: cannot write there \({run} is not",
        capsys,
    )
    assert not forwards and files_under(run) == before


def test_survey_into_a_read_only_directory_is_refused_before_loading(
    model, tmp_path, read_only, forwards, capsys
):
    read_only(tmp_path)
    expect_cli_refusal(
        ["survey", str(model), "--out", str(tmp_path / "findings" / "tiny")],
        rf"error: --out {tmp_path}/findings/tiny: cannot write there \({tmp_path} is not writable",
        capsys,
    )
    assert not forwards and files_under(tmp_path) == []


def test_convert_into_a_file_or_a_read_only_cache_is_refused_before_dequantising(
    tmp_path, read_only, monkeypatch, capsys
):
    pytest.importorskip("gguf")
    from test_gguf import tiny_llama, write_gguf

    from pe_interp.runs import gguf as pg

    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    monkeypatch.setattr(pg, "_load", lambda *_: pytest.fail("de-quantised before the refusal"))
    (tmp_path / "a-file").write_text("not a directory")
    expect_cli_refusal(
        ["convert", str(path), "--cache", str(tmp_path / "a-file")],
        rf"error: {path}: the cache {tmp_path}/a-file: exists and is not a directory; give a directory$",
        capsys,
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    read_only(cache)
    expect_cli_refusal(
        ["convert", str(path), "--cache", str(cache)],
        rf"error: {path}: the cache {cache}: cannot write there \(not writable by this user\); "
        "give --cache a directory you can write$",
        capsys,
    )
    monkeypatch.setenv(pg.CACHE_ENV, str(cache))  # where a command converts the file itself
    expect_cli_refusal(
        ["ablate", str(path), "--task", "distance", "--preset", "smoke"],
        rf"error: {path}: the GGUF cache \(where it is converted and its results go\) {cache}/gguf: "
        rf"cannot write there \({cache} is not writable by this user\); set {pg.CACHE_ENV} to a "
        "directory you can write$",
        capsys,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "cache", "tiny.gguf"]
    assert files_under(cache) == []


# ------------------------------------------------------------------------------------------------
# damaged weights, in any format
# ------------------------------------------------------------------------------------------------
def _truncated(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _garbled_header(d: Path) -> None:
    data = bytearray((d / "model.safetensors").read_bytes())
    data[20:30] = b"xxxxxxxxxx"
    (d / "model.safetensors").write_bytes(bytes(data))


def _nan_weight(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    tensors["model.layers.1.self_attn.v_proj.weight"].view(-1)[3] = float("nan")
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def _truncated_bin(d: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    torch.save(tensors, d / "pytorch_model.bin")
    data = (d / "pytorch_model.bin").read_bytes()
    (d / "pytorch_model.bin").write_bytes(data[: len(data) - 200])


@pytest.mark.parametrize("damage,pattern", [
    (_truncated, r"the weights file model\.safetensors is damaged \(.*\); save or download the "
     "model again$"),
    (_garbled_header, r"the weights file model\.safetensors is damaged \("),
    (_truncated_bin, r"the weights file pytorch_model\.bin is damaged \("),
    (_nan_weight, r"the weights hold NaN \(in model\.layers\.1\.self_attn\.v_proj\.weight\): the "
     r"file is damaged or the model it was saved from diverged; save or download the model again"),
], ids=["truncated", "garbled-header", "truncated-bin", "nan"])  # fmt: skip
def test_damaged_weights_are_refused_before_the_first_forward(
    model_copy, tmp_path, damage, pattern, forwards, capsys
):
    damage(model_copy)
    before = files_under(tmp_path)
    out = tmp_path / "findings" / "tiny"
    for argv in (
        ["ablate", str(model_copy), "--task", "induction", "--no-figures", "--no-progress"],
        ["survey", str(model_copy), "--out", str(out)],  # its accuracy step read 0 of 8 and went on
        ["heads", str(model_copy), "--task", "distance", "--preset", "smoke"],
    ):
        expect_cli_refusal(argv, rf"error: {model_copy}: {pattern}", capsys)
    assert not forwards and files_under(tmp_path) == before


def test_a_gguf_file_with_nan_weights_is_refused_before_it_is_cached(tmp_path, capsys):
    pytest.importorskip("gguf")
    from test_gguf import tiny_llama, write_gguf

    hf = tiny_llama()
    with torch.no_grad():
        hf.model.layers[0].mlp.up_proj.weight[2, 5] = float("inf")
    path = write_gguf(hf, tmp_path / "tiny.gguf")
    expect_cli_refusal(
        ["convert", str(path), "--cache", str(tmp_path / "cache")],
        rf"error: {path}: the weights hold inf \(in model\.layers\.0\.mlp\.up_proj\.weight\): the "
        "file is damaged or the model it was saved from diverged; download the GGUF file again$",
        capsys,
    )
    assert files_under(tmp_path) == ["tiny.gguf"]


def test_a_probe_given_a_pretrained_model_with_nan_weights_names_the_fix_that_fits(model):
    from bad_input_env import expect_value_error

    from pe_interp.runs.model_dirs import load_model_dir
    from probes import ablate_heads

    run = load_model_dir(model, "induction", accuracy=False)
    ps = run.task.prompts[:4]
    with torch.no_grad():
        run.model.bridge.original_model.model.layers[0].self_attn.o_proj.weight[1, 1] = float("nan")
    expect_value_error(
        lambda: ablate_heads(run.model, ps.tokens, ps.labels, pad_mask=ps.pad_mask),
        r"^ablate_heads: the model has non-finite weights \(NaN in "
        r"bridge\.blocks\.0\.self_attn\.o_proj\.weight\); its file is damaged or the weights were edited: "
        r"load it again \(pe_interp\.load\) from an intact file$",
    )


# ------------------------------------------------------------------------------------------------
# files as people save them
# ------------------------------------------------------------------------------------------------
POSITION = {"prompt": "apple bag cat apple", "answer": " bag",
            "counterfactual_prompt": "apple cat bag apple", "counterfactual_answer": " cat"}  # fmt: skip
CONTENT = {"prompt": "Paris is the capital of", "answer": " France",
           "counterfactual_prompt": "apple is the capital of", "counterfactual_answer": " bag"}  # fmt: skip
PLAIN = [
    {"prompt": "desk coin desk", "answer": " coin"},
    {"prompt": "cat bag cat", "answer": " bag"},
]


def prompts_file(path: Path, lines: list[dict], newline: str = "\n", bom: bool = False) -> Path:
    text = "".join(json.dumps(line) + newline for line in lines)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


@pytest.mark.parametrize(
    "newline,bom", [("\r\n", False), ("\n", True), ("\r\n", True)], ids=["crlf", "bom", "bom-crlf"]
)
def test_a_prompts_file_as_editors_save_it_is_read(tmp_path, newline, bom):
    from pe_interp.prompts.jsonl import count_counterfactuals, load_jsonl

    lines = [POSITION, *PLAIN, {"prompt": "desk\u2028coin desk", "answer": " coin"}]
    plain = load_jsonl(prompts_file(tmp_path / "plain.jsonl", lines), TOK, family="f")
    path = prompts_file(tmp_path / "saved.jsonl", lines, newline, bom)
    saved = load_jsonl(path, TOK, family="f")
    assert torch.equal(saved.prompts.tokens, plain.prompts.tokens) and len(saved.prompts) == 4
    assert torch.equal(saved.prompts.labels, plain.prompts.labels)
    assert saved.pair_lines == plain.pair_lines == (1,)
    assert torch.equal(saved.counterfactuals.corrupt.tokens, plain.counterfactuals.corrupt.tokens)
    assert count_counterfactuals(path) == 1


def test_a_bad_line_of_a_crlf_file_is_named_by_its_number(tmp_path):
    from bad_input_env import expect_value_error

    from pe_interp.prompts.jsonl import load_jsonl

    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"prompt": "desk coin desk", "answer": " coin"}\r\n\r\n{"prompt": 3}\r\n'
    )
    expect_value_error(lambda: load_jsonl(path, TOK), rf"^{path}:3: missing field 'answer'$")


# ------------------------------------------------------------------------------------------------
# the survey: every step checked before the first one runs; resumed steps; what each step used
# ------------------------------------------------------------------------------------------------
SMALL = ["--n", "8", "--n-bootstrap", "40"]


@pytest.fixture
def no_load(monkeypatch):
    """The model must not load (a refusal that needs no model comes before it)."""
    import pe_interp.runs.model_dirs as model_dirs

    monkeypatch.setattr(model_dirs, "load_model_dir", lambda *a, **k: pytest.fail("loaded"))


def test_a_prompts_file_without_counterfactuals_is_refused_before_the_model_loads(
    model, tmp_path, forwards, capsys, no_load
):
    plain = prompts_file(tmp_path / "plain.jsonl", PLAIN)
    out = tmp_path / "out"
    expect_cli_refusal(
        ["survey", str(model), "--out", str(out), "--family", str(plain), *SMALL],
        rf"error: --family {plain}: no line gives a counterfactual_prompt, which patching and "
        r"routes need \(clean/counterfactual pairs\): add counterfactual_prompt and "
        "counterfactual_answer to its lines, or leave patching and routes out "
        r"\(--steps accuracy ablation head_types frequency\)$",
        capsys,
    )
    expect_cli_refusal(
        ["survey", str(model), "--out", str(out), "--family", str(plain), "--steps", "patching"],
        r"which patching needs \(clean/counterfactual pairs\): .* leave patching out$",
        capsys,
    )
    assert not forwards and not out.exists()


def test_frequency_alone_is_refused_before_the_model_loads_and_writes_nothing(
    model, tmp_path, forwards, capsys, no_load
):
    out = tmp_path / "out"
    expect_cli_refusal(
        ["survey", str(model), "--out", str(out), "--steps", "frequency"],
        rf"error: --steps frequency reads the heads the head_types step typed, and {out} has no "
        "head_types.json: add head_types to --steps$",
        capsys,
    )
    expect_cli_refusal(
        ["survey", str(model), "--out", str(out), "--steps", "accuracy", "--redo", "ablation"],
        r"error: --redo ablation: not among --steps \(accuracy\); add it to --steps$",
        capsys,
    )
    expect_cli_refusal(
        ["survey", str(model), "--out", str(out), "--n", "1025"],
        r"error: --n must be <= 1024 for a prompt family \(the most prompts it draws\), got 1025$",
        capsys,
    )
    assert not forwards and not out.exists()


def test_content_counterfactuals_are_labelled_so_and_cannot_serve_routes(
    model, tmp_path, forwards, capsys
):
    content = prompts_file(tmp_path / "content.jsonl", [CONTENT, *PLAIN])
    out = tmp_path / "out"
    argv = ["survey", str(model), "--out", str(out), "--family", str(content), *SMALL]
    expect_cli_refusal(
        argv,  # every step: routes cannot read these pairs, refused before the first forward
        rf"error: --family {content}: its counterfactuals change the tokens \(content "
        r"counterfactuals\), and route shares measure position on position-only pairs",
        capsys,
    )
    assert not forwards and not out.exists()
    assert main([*argv, "--steps", "patching", "ablation"]) == 0
    saved = json.loads((out / "patching.json").read_text())
    assert saved["counterfactual"]["kind"] == "content" and saved["n_used"] == 1
    text = (out / "SURVEY.md").read_text()
    assert "## Head patching, content counterfactuals" in text
    assert "its content counterfactual (1 pairs: the prompt's tokens changed" in text
    assert "position-only" not in text and "the same tokens moved" not in text
    # the counts each step used: 3 prompts for the ablation (the file's), 1 pair for patching
    assert "(seed 0, used: ablation 3, patching 1 pairs)" in text
    assert json.loads((out / "ablation.json").read_text())["result"]["n_examples"] == 3


def test_position_pairs_from_a_file_are_labelled_position_only(model, tmp_path, capsys):
    moved = prompts_file(tmp_path / "moved.jsonl", [POSITION, *PLAIN])
    out = tmp_path / "out"
    argv = ["survey", str(model), "--out", str(out), "--family", str(moved), *SMALL]
    assert main([*argv, "--steps", "patching"]) == 0
    assert json.loads((out / "patching.json").read_text())["counterfactual"]["kind"] == "position"
    assert "## Head patching, position-only counterfactuals" in (out / "SURVEY.md").read_text()


def test_a_resumed_step_with_other_options_is_run_again(model, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["survey", str(model), "--out", str(out), "--n", "8", "--steps", "accuracy", "ablation"]
    assert main([*argv, "--n-bootstrap", "40"]) == 0
    capsys.readouterr()
    assert main([*argv, "--n-bootstrap", "40"]) == 0
    said = capsys.readouterr().out
    assert "ablation: done before" in said and "accuracy: done before" in said
    assert main([*argv, "--n-bootstrap", "50"]) == 0
    said = capsys.readouterr().out
    assert "accuracy: done before" in said  # no bootstrap there
    assert "[2/2] ablation again: --n-bootstrap 40 before, 50 now ..." in said
    assert json.loads((out / "ablation.json").read_text())["result"]["n_bootstrap"] == 50
    assert main([*argv, "--n-bootstrap", "50", "--seed", "1"]) == 0
    said = capsys.readouterr().out  # another seed: other prompts, so every step again
    assert "accuracy again: other weights or prompts" in said and "ablation again" in said


def test_frequency_reading_head_types_of_another_n_is_refused_before_the_first_forward(
    model, tmp_path, forwards, capsys
):
    out = tmp_path / "out"
    assert main(["survey", str(model), "--out", str(out), *SMALL, "--steps", "head_types"]) == 0
    before = files_under(out)
    forwards.clear()
    capsys.readouterr()
    expect_cli_refusal(
        ["survey", str(model), "--out", str(out), "--n", "16", "--steps", "frequency"],
        rf"error: {out}/head_types.json is not of this survey \(--n 8 before, 16 now\), and the "
        "frequency step reads its heads: add head_types to --steps$",
        capsys,
    )
    assert not forwards and files_under(out) == before


def test_survey_n_is_the_number_each_step_used(model, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "survey",
        str(model),
        "--out",
        str(out),
        "--n",
        "100",
        "--steps",
        "accuracy",
        "head_types",
    ]
    assert main(argv) == 0
    acc = json.loads((out / "accuracy.json").read_text())["families"]
    assert [row["n"] for row in acc] == [100, 100, 100]  # not the quick preset's 64
    types = json.loads((out / "head_types.json").read_text())
    assert types["n_used"] == types["result"]["n_examples"] == 100
    assert "(seed 0, 100 used)" in (out / "SURVEY.md").read_text()


def test_a_model_that_cannot_serve_a_step_is_refused_before_its_first_forward_on_the_prompts(
    tmp_path, forwards, monkeypatch, capsys
):
    """GPT-2's positions are learned, not rotated: no frequency step. Refused once the model is
    built (building it reads its encoding with one forward of a few random tokens, counted
    apart) and before any forward on the prompts."""
    import pe_interp.runs.model_dirs as model_dirs

    hf = build_hf_model(
        "gpt2", seed=1, n_layers=1, d_model=16, n_heads=2, d_mlp=32, n_ctx=96,
        d_vocab=len(TOK), pad_id=0,
    )  # fmt: skip
    gpt2 = save_model_dir(hf, TOK, tmp_path / "gpt2")
    capsys.readouterr()  # the saving's bar
    load = model_dirs.load_model_dir
    built = []

    def counted_load(*args, **kwargs):
        run = load(*args, **kwargs)
        built.append(list(forwards))  # the model's own construction
        forwards.clear()
        return run

    monkeypatch.setattr(model_dirs, "load_model_dir", counted_load)
    out = tmp_path / "out"
    expect_cli_refusal(
        ["survey", str(gpt2), "--out", str(out), *SMALL],
        rf"error: {gpt2}: gpt2: learned absolute does not rotate queries and keys; frequency usage is "
        "defined for rotary encodings \\(RoPE\\): leave frequency out of --steps$",
        capsys,
    )
    assert len(built) == 1 and not forwards and not out.exists()


# ------------------------------------------------------------------------------------------------
# messages that name the problem and the fix
# ------------------------------------------------------------------------------------------------
def _config(text: str | None):
    def make(d: Path) -> Path:
        d.mkdir()
        if text is not None:
            (d / "config.json").write_text(text)
        return d

    return make


@pytest.mark.parametrize("make,pattern", [
    (_config(None), r"{d}: an empty directory, neither a saved Hugging Face model \(save_pretrained "
     r"writes its config\.json, weights and tokenizer\) nor a pe-interp run$"),
    (_config('{"model_type": "llama",'), r"{d}/config\.json: not valid JSON \(.*\); saved Hugging "
     "Face model .* names its model_type there$"),
    (_config('{"hidden_size": 32}'), r"{d}/config\.json: no model_type, so not a saved Hugging "
     r"Face model .*, nor the config of a pe-interp run$"),
], ids=["empty", "invalid-json", "no-model-type"])  # fmt: skip
def test_a_directory_that_is_no_model_says_what_it_is(tmp_path, make, pattern, forwards, capsys):
    d = make(tmp_path / "d")
    before = files_under(tmp_path)
    expect_cli_refusal(
        ["ablate", str(d), "--task", "induction"], "error: " + pattern.format(d=d), capsys
    )
    assert "knows its task" not in pattern and not forwards and files_under(tmp_path) == before


def test_an_unknown_task_lists_every_task_a_model_takes(model, forwards, capsys):
    expect_cli_refusal(
        ["ablate", str(model), "--task", "sorting"],
        rf"error: {model}: task must be one of distance, count, retrieve \(our tasks in "
        r"language-model form\), induction, recall, successor \(prompt families in the model's own "
        r"tokens\) or FILE\.jsonl \(a prompts file\); got 'sorting'$",
        capsys,
    )
    assert not forwards


def test_show_and_report_read_a_survey_directory(model, tmp_path, capsys):
    out = tmp_path / "findings" / "tiny"
    assert main(["survey", str(model), "--out", str(out), *SMALL, "--steps", "accuracy"]) == 0
    (out / "SURVEY.md").unlink()
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"survey {out}  (pe-interp survey: where position lives")
    assert (
        "  steps      accuracy\n" in shown and "- Accuracy on natural prompts: induction " in shown
    )
    assert f"{out / 'SURVEY.md'} (not written yet); pe-interp report {out} rebuilds it" in shown
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out / 'SURVEY.md'}\n"
    assert "## Accuracy per prompt family" in (out / "SURVEY.md").read_text()


def test_show_reads_a_model_directory_and_report_points_to_the_commands_that_do(model_copy, capsys):
    assert main(["show", str(model_copy)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(
        f"model {model_copy}  (a saved Hugging Face model, not a pe-interp run)"
    )
    assert (
        "  shape      llama: 2 layers, 4 heads (2 key/value heads), d_model 32, vocabulary" in shown
    )
    assert "results      none yet" in shown
    argv = ["ablate", str(model_copy), "--task", "induction", "--n", "4", "--n-bootstrap", "0"]
    assert main([*argv, "--no-figures", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["show", str(model_copy)]) == 0
    shown = capsys.readouterr().out
    assert "  ablation.json                ablation, of these weights\n" in shown
    assert "  deposits.json                deposit, of these weights\n" in shown
    expect_cli_refusal(
        ["report", str(model_copy)],
        rf"error: {model_copy}: a saved Hugging Face model, not a pe-interp run: pe-interp show "
        rf"{model_copy} lists the results written into it, and pe-interp survey {model_copy} "
        r"--out DIR writes a report of every probe on it \(DIR/SURVEY\.md\)$",
        capsys,
    )


def test_show_reads_a_gguf_file_through_its_converted_directory(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gguf")
    from test_gguf import tiny_llama, write_gguf

    from pe_interp.runs import gguf as pg

    monkeypatch.setenv(pg.CACHE_ENV, str(tmp_path / "cache"))
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"GGUF file {path}: not converted yet\n")
    assert not (tmp_path / "cache").exists()  # show converts nothing
    out = pg.convert_gguf(path)
    assert main(["show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"  converted  {out}\n" in shown
    assert "  from GGUF  tiny.gguf (sha256 " in shown and "ALL_F32), dequantised to fp32" in shown


# ------------------------------------------------------------------------------------------------
# numeric options outside what their method can use
# ------------------------------------------------------------------------------------------------
SEED_MESSAGE = (
    r"argument --seed: must be in 0\.\.9223372036854775807 \(2\*\*63 - 1: the generators take 64 "
    r"bits, with room for the seeds derived from it\), got {seed} \(see pe-interp {cmd} --help\)$"
)


@pytest.mark.parametrize("seed", [str(2**64), str(2**63), "-1"])
def test_a_seed_past_64_bits_is_refused_before_the_work(model, tmp_path, seed, forwards, capsys):
    out = tmp_path / "out"
    for cmd, argv in (
        ("ablate", ["ablate", str(model), "--task", "induction"]),
        ("survey", ["survey", str(model), "--out", str(out)]),
        ("train", ["train", "--preset", "smoke", "--out", str(out)]),
        ("patch", ["patch", str(model), "--task", "induction"]),
        ("routes", ["routes", str(model), "--task", "induction"]),
    ):
        expect_cli_refusal([*argv, "--seed", seed], SEED_MESSAGE.format(seed=seed, cmd=cmd), capsys)
    assert not forwards and files_under(tmp_path) == []
    from bad_input_env import expect_value_error

    from pe_interp import ModelConfig, TrainConfig

    expect_value_error(lambda: TrainConfig(seed=int(seed)), r"^TrainConfig\.seed must be in 0\.\.")
    expect_value_error(
        lambda: ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_classes=3, n_ctx=8,
                            seed=int(seed)),
        r"^ModelConfig\.seed must be in 0\.\.",
    )  # fmt: skip


def test_the_largest_seed_trains(tmp_path):
    """Its derived epoch seeds stay within 64 bits (seed * 1_000_003 + epoch overflowed them)."""
    run = pe_interp.train(out=tmp_path / "run", progress=False, **{**TINY, "seed": 2**63 - 1})
    assert run is not None and (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.parametrize("argv,pattern", [
    (["ablate", "{m}", "--task", "induction", "--n-bootstrap", "1"],
     r"--n-bootstrap 1 is too few replicates for a 95% interval \(each of its tails must hold at "
     r"least one\): give 0 \(no intervals\) or at least 40$"),
    (["patch", "{m}", "--task", "induction", "--n-bootstrap", "39"],
     r"--n-bootstrap 39 is too few .*: give 0 \(no intervals\) or at least 40$"),
    (["routes", "{m}", "--task", "induction", "--n-bootstrap", "20"],
     r"--n-bootstrap 20 is too few .*: give at least 40$"),
    (["survey", "{m}", "--out", "{o}", "--n-bootstrap", "10"],
     r"--n-bootstrap 10 is too few .*: give at least 40$"),
    (["ablate", "{m}", "--task", "induction", "--method", "mean", "--n", "1"],
     r"--method mean with --n 1: mean ablation replaces a head's output with other examples' "
     r"\(their mean, or another example's\), so it needs at least 2 examples \(with one, every "
     r"drop would be exactly 0\)$"),
    (["ablate", "{m}", "--task", "induction", "--method", "resample", "--n", "1"],
     r"--method resample with --n 1: resample ablation .* at least 2 examples"),
], ids=["ablate-1", "patch-39", "routes-20", "survey-10", "mean-n1", "resample-n1"])  # fmt: skip
def test_a_number_its_method_cannot_use_is_refused_before_the_model_loads(
    model, tmp_path, argv, pattern, forwards, capsys, no_load, monkeypatch
):
    import pe_interp.runs.load as load

    monkeypatch.setattr(load, "open_run", lambda *a, **k: pytest.fail("loaded"))
    argv = [a.format(m=model, o=tmp_path / "out") for a in argv]
    expect_cli_refusal(argv, "error: " + pattern, capsys)
    assert not forwards and files_under(tmp_path) == []


def test_mean_ablation_of_one_example_is_refused_by_the_probe(model):
    from bad_input_env import expect_value_error

    from pe_interp.runs.model_dirs import load_model_dir
    from probes import ablate_heads

    run = load_model_dir(model, "induction", accuracy=False)
    ps = run.task.prompts[:1]
    expect_value_error(
        lambda: ablate_heads(run.model, ps.tokens, ps.labels, pad_mask=ps.pad_mask, method="mean"),
        r"^ablate_heads: mean ablation needs at least 2 examples \(or a reference set\): over one "
        r"example the mean output is that example's own, and every drop would be exactly 0$",
    )
    two = run.task.prompts[:2]  # two examples: a mean that is not either one
    r = ablate_heads(run.model, two.tokens, two.labels, pad_mask=two.pad_mask, method="mean",
                     n_bootstrap=0)  # fmt: skip
    assert r.n_examples == 2


# ------------------------------------------------------------------------------------------------
# a model whose attention is not causal, whatever its config claims
# ------------------------------------------------------------------------------------------------
def test_a_model_that_attends_both_ways_is_refused_whatever_its_config_claims(
    model_copy, tmp_path, forwards, monkeypatch, capsys
):
    """A LlamaForCausalLM saved with "is_causal": false: transformers runs it bidirectionally
    (a later token moves earlier logits), the bridge would mask it causally and probe another
    model. Refused before any forward of the model (the check's miniature apart)."""
    import pe_interp.models.bridge.model as bridge_model

    config = json.loads((model_copy / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    monkeypatch.setattr(bridge_model.BridgedModel, "__init__", lambda *a: pytest.fail("built"))
    before = files_under(tmp_path)
    pattern = (
        rf"error: {model_copy}: its attention is not causal \(a token moves the logits at the "
        r"positions before it\) although its config names LlamaForCausalLM, is_causal False; the "
        "probes read causal language models$"
    )
    out = tmp_path / "out"
    for argv in (
        ["ablate", str(model_copy), "--task", "induction", "--no-figures", "--no-progress"],
        ["survey", str(model_copy), "--out", str(out)],
        ["heads", str(model_copy), "--task", "distance", "--preset", "smoke"],
    ):
        expect_cli_refusal(argv, pattern, capsys)
    assert not forwards and forwards.checks and files_under(tmp_path) == before


def test_a_causal_model_passes_the_check(model, forwards):
    from pe_interp.runs.causal import check_attends_causally

    check_attends_causally(model, "tiny")  # no error
    assert forwards.checks[0] == "LlamaForCausalLM" and not forwards

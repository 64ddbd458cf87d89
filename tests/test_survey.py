"""``pe-interp survey``: every step on a tiny pretrained-style model, the numbers equal the probes
called directly on the same prompts, a second run resumes without running a step again, and the
report (SURVEY.md, figures, README block) is rebuilt from the findings alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from prompt_env import make_tokenizer

from pe_interp.cli import main
from pe_interp.models.bridge.hf_arch import build_hf_model, save_model_dir
from pe_interp.report.survey import load_steps, write_survey_report
from pe_interp.runs.model_dirs import load_model_dir

TOK = make_tokenizer()
ARGS = ["--n", "16", "--n-bootstrap", "40"]


@pytest.fixture(scope="module")
def surveyed(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("survey")
    hf = build_hf_model(
        "llama", seed=5, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_mlp=64,
        n_ctx=96, d_vocab=len(TOK), pad_id=0,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for weight in hf.parameters():
            if weight.dim() == 2:
                weight.copy_(torch.randn(weight.shape, generator=gen) * 0.3)
    model = save_model_dir(hf, TOK, root / "model")
    out = root / "findings" / "tiny"
    assert main(["survey", str(model), "--out", str(out), *ARGS]) == 0
    return model, out


def test_each_step_equals_the_probe_called_directly(surveyed):
    from probes.ablation import ablate_heads
    from probes.patching.sweep import patch

    model, out = surveyed
    steps = load_steps(out)
    assert set(steps) == {
        "accuracy", "ablation", "patching", "routes", "head_types", "frequency", "circuit",
    }  # fmt: skip
    run = load_model_dir(model, "induction")
    prompts = run.task.prompts[:16]
    direct = ablate_heads(run.model, prompts.tokens, prompts.labels, pad_mask=prompts.pad_mask)
    saved = steps["ablation"]["result"]
    assert np.allclose(np.array(saved["drops"], dtype=float), direct.drops, atol=1e-9)
    assert "undecided (n = 16, need ≥ 59" in steps["ablation"]["single"]["text"]
    pairs = run.task.prompt_pairs(16, "position", seed=0)
    patched = patch(
        run.model, pairs.clean.tokens, pairs.corrupt.tokens, clean_labels=pairs.clean.labels,
        corrupt_labels=pairs.corrupt.labels, pad_mask=pairs.pad_mask, n_bootstrap=0,
    )  # fmt: skip
    values = np.array(steps["patching"]["result"]["values"], dtype=float)
    assert np.allclose(values, patched.values.numpy(), atol=1e-5)
    acc = {r["family"]: r for r in steps["accuracy"]["families"]}
    assert set(acc) == {"induction", "recall", "successor"} and acc["induction"]["n"] == 16
    for step in steps.values():
        assert step["weights"]["sha256"] == run.provenance["sha256"]
        assert step["survey"]["prompts"]["name"] == "induction"


def test_a_second_run_resumes_and_redo_runs_one_step(surveyed, monkeypatch, capsys):
    import pe_interp.commands.survey as survey

    model, out = surveyed
    ran = []
    for name, fn in list(survey.STEP_FUNCTIONS.items()):
        monkeypatch.setitem(
            survey.STEP_FUNCTIONS, name, lambda loaded, args, fn=fn, name=name: ran.append(name) or fn(loaded, args)
        )  # fmt: skip
    before = (out / "ablation.json").read_bytes()
    assert main(["survey", str(model), "--out", str(out), *ARGS]) == 0
    assert ran == [] and "accuracy: done before" in capsys.readouterr().out
    assert (out / "ablation.json").read_bytes() == before
    assert main(["survey", str(model), "--out", str(out), *ARGS, "--redo", "accuracy"]) == 0
    assert ran == ["accuracy"]
    assert main(["survey", str(model), "--out", str(out), "--n", "8", "--n-bootstrap", "40",
                 "--steps", "accuracy"]) == 0  # fmt: skip
    assert ran == ["accuracy", "accuracy"]  # another n: the step's file no longer matches


def test_the_report_is_rebuilt_from_the_findings(surveyed, tmp_path):
    _, out = surveyed
    text = (out / "SURVEY.md").read_text()
    assert text.startswith("# Where does position live? `tiny`")
    assert "| induction | " in text and "## Exact ablation of every head" in text
    assert (out / "ablation.png").stat().st_size > 0 and (out / "patching.png").stat().st_size > 0
    readme = tmp_path / "findings" / "README.md"  # where the committed survey's block lives
    readme.parent.mkdir()
    readme.write_text("intro\n<!-- study:tiny begin -->\nold\n<!-- study:tiny end -->\nend\n")
    (out / "SURVEY.md").unlink()
    write_survey_report(out, readme)
    assert (out / "SURVEY.md").read_text() == text
    block = readme.read_text()
    assert "old" not in block and "- Accuracy on natural prompts: induction " in block
    assert block.startswith("intro\n") and block.endswith("end\n")
    with pytest.raises(ValueError, match="no survey findings"):
        write_survey_report(tmp_path / "empty")
    json.loads((out / "routes.json").read_text())  # the files stay plain JSON
    # the heads across probes: each probe's top head is a row, at rank 1 in its own column
    steps = load_steps(out)
    drops = np.array(steps["ablation"]["result"]["drops"], dtype=float)
    shares = np.array(steps["routes"]["result"]["shares"], dtype=float)
    for grid, column, scale in ((drops, 1, 100.0), (shares, 3, 100.0)):
        lh = np.unravel_index(np.argmax(grid), grid.shape)
        across = text.split("## The heads the probes single out")[1]
        row = next(r for r in across.splitlines() if r.startswith(f"| L{lh[0]}H{lh[1]} |"))
        assert row.split(" | ")[column] == f"{scale * grid[lh]:+.1f} [1]"


def test_the_circuit_step_is_the_aligned_circuit_command_on_the_same_pairs(surveyed):
    """The step's digest equals ``circuit_run(..., aligned=True, method="atp", faithful=0.9)`` on
    the survey's prompts, read into the head of the largest route share; its units are in ranking
    order (|position score|, σ-aligned), its counts add up, and the report sets it beside the
    heads the other probes single out."""
    from pe_interp.commands.circuit import circuit_run
    from pe_interp.commands.survey_circuit import circuit_digest

    model, out = surveyed
    steps = load_steps(out)
    res = steps["circuit"]["result"]
    shares = np.array(steps["routes"]["result"]["shares"], dtype=float)
    lh = tuple(int(i) for i in np.unravel_index(np.nanargmax(shares), shares.shape))
    assert res["meta"]["top_head"] == f"L{lh[0]}H{lh[1]}" and res["meta"]["aligned"]
    run = load_model_dir(model, "induction")
    c, _ = circuit_run(
        run.model, run.task, run, method="atp", aligned=True, faithful=0.9, n=16,
        route_head=(lh, "given"),
    )  # fmt: skip
    direct = json.loads(json.dumps(circuit_digest(c), default=float))
    assert res["top_edges"] == direct["top_edges"] and res["size"] == direct["size"]
    assert res["faithfulness"]["kept"] == pytest.approx(direct["faithfulness"]["kept"], abs=1e-9)
    f = res["faithfulness"]
    assert f["kept"] >= 0.9 and f["forwards"] == len(f["sizes"]) and f["aligned"]
    position = [abs(row[3]) for row in res["top_edges"]]
    assert position == sorted(position, reverse=True)
    assert sum(res["span_counts"].values()) == res["size"]
    assert set(res["span_counts"]) <= set(res["span_names"]) and "answer" in res["span_names"]
    text = (out / "SURVEY.md").read_text()
    assert "## A σ-aligned, position-aware circuit" in text
    assert "circuit: first unit out (rank; units out, in)" in text


def test_demo_real_without_smollm2_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from bad_input_env import expect_cli_refusal

    monkeypatch.chdir(tmp_path)
    expect_cli_refusal(["demo", "--real"], r"SmolLM2 is not installed .*: run make smollm2", capsys)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_survey_refuses_bad_input_in_one_line(tmp_path, capsys):
    from bad_input_env import expect_cli_refusal

    expect_cli_refusal(["survey", str(tmp_path)], r"give a MODEL and --out", capsys)
    expect_cli_refusal(
        ["survey", str(tmp_path), "--out", str(tmp_path / "o"), "--family", "distance"],
        r"--family must be a prompt family or a \.jsonl file, got 'distance'",
        capsys,
    )
    expect_cli_refusal(
        ["survey", str(tmp_path), "--out", str(tmp_path / "o")],
        r"not a saved Hugging Face model",
        capsys,
    )
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": "desk coin desk", "answer": " coin"}) + "\n")
    expect_cli_refusal(
        ["survey", str(tmp_path), "--out", str(tmp_path / "o"), "--family", str(mine),
         "--steps", "accuracy", "circuit"],
        r"a prompts file names no spans .*: leave circuit out of --steps",
        capsys,
    )  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_head_types_and_frequency_equal_the_probes(surveyed):
    from probes.decomposition import FrequencyUsage, frequency_usage, low_frequency_norm
    from probes.heads.types import HeadTypeScores, head_type_scores

    model, out = surveyed
    steps = load_steps(out)
    run = load_model_dir(model, "induction")
    prompts = run.task.prompts[:16]
    types = head_type_scores(run.model, prompts.tokens, pad_mask=prompts.pad_mask)
    saved = HeadTypeScores.from_dict(steps["head_types"]["result"])
    for kind in types.scores:
        assert torch.allclose(saved.scores[kind], types.scores[kind], atol=1e-9)
    usage = frequency_usage(run.model, prompts.tokens, pad_mask=prompts.pad_mask)
    kept = FrequencyUsage.from_dict(steps["frequency"]["result"])
    assert torch.allclose(kept.norm_share, usage.norm_share, atol=1e-9)
    assert steps["frequency"]["findings"]["low_frequency_norm"]["k"] == low_frequency_norm(usage).k
    assert steps["frequency"]["positional_heads"] == [
        list(h) for h in types.types()["previous_token"]
    ]
    text = (out / "SURVEY.md").read_text()
    assert "## Head types" in text and "## RoPE frequency usage" in text
    assert (out / "head_types.png").is_file() and (out / "frequency.png").is_file()


def test_a_step_is_done_by_its_weights_not_by_the_path_they_were_named_by(tmp_path):
    """A survey started on ``.cache/x.gguf`` resumes when named by its absolute path: the weights
    are the same (sha256, origin); other weights or another n are not done."""
    import json

    from pe_interp.commands.survey_checks import done as _done

    def stamp(file, sha="ab", n=64):
        source = {"weights": "model.safetensors", "gguf": {"sha256": "cd"}, "file": file}
        return {"weights": {"sha256": sha, "step": None, "source": source}, "prompts": {}, "n": n}

    path = tmp_path / "ablation.json"
    path.write_text(json.dumps({"survey": stamp(".cache/x.gguf")}))
    assert _done(path, stamp("/home/me/.cache/x.gguf"))
    assert not _done(path, stamp("/home/me/.cache/x.gguf", sha="ef"))
    assert not _done(path, stamp(".cache/x.gguf", n=32))

"""``pe-interp train --arch``: the paper's encodings as real architectures (GPT-2, GPT-NeoX, Llama,
BLOOM) trained by our trainer on a task in language-model form, saved as a run and as a Hugging
Face directory, and probed like any run (issue 38)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from conftest import smoke_trainer

import pe_interp
from pe_interp.cli import main
from pe_interp.models.bridge.hf_arch import boot_bridge
from pe_interp.models.bridge.model import BridgedModel
from pe_interp.runs.arch import HF_DIR
from pe_interp.runs.checkpoint import load_run
from probes import AblationResult, ablate_heads


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    out = tmp_path_factory.mktemp("arch") / "neox"
    pe_interp.train(
        preset="smoke",
        arch="gpt-neox",
        seed=1,
        out=out,
        snapshots="log",
        snapshot_every=8,
        progress=False,
    )
    return out


def test_train_arch_then_ablate_reads_the_run(neox, capsys):
    assert main(["ablate", str(neox), "--n-bootstrap", "40", "--no-figures", "--no-progress"]) == 0
    assert "gpt-neox: partial rotary" in capsys.readouterr().out
    saved = AblationResult.load(neox / "ablation.json")
    run = load_run(neox)
    assert isinstance(run.model, BridgedModel) and run.model.cfg.n_classes == run.task.n_classes
    test = run.examples("test")
    again = ablate_heads(
        run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=40
    )
    np.testing.assert_allclose(saved.values, again.values, atol=1e-9)


def test_the_run_is_also_a_saved_hugging_face_model(neox):
    run = load_run(neox)
    test = run.examples("test", 32)
    hf_dir = BridgedModel(
        boot_bridge(neox / HF_DIR),
        answers=range(run.task.d_vocab, run.task.d_vocab + run.task.n_classes),
        pad_id=0,
    )
    with torch.no_grad():
        assert torch.allclose(
            hf_dir(test.tokens, test.pad_mask), run.model(test.tokens, test.pad_mask), atol=1e-6
        )
    assert (
        main(
            [
                "ablate",
                str(neox / HF_DIR),
                "--task",
                "distance",
                "--preset",
                "smoke",
                "--n-bootstrap",
                "0",
                "--no-figures",
                "--no-progress",
            ]
        )
        == 0
    )


def test_a_snapshot_of_an_architecture_is_probed_at_its_step(neox):
    early, final = load_run(neox, step=8), load_run(neox)
    test = final.examples("test", 32)
    with torch.no_grad():
        a, b = early.model(test.tokens, test.pad_mask), final.model(test.tokens, test.pad_mask)
    assert not torch.allclose(a, b)
    assert early.provenance["sha256"] != final.provenance["sha256"]


def test_dynamics_of_an_architecture_walks_its_snapshots_with_routes(neox, capsys):
    import json

    assert (
        main(
            [
                "dynamics",
                str(neox),
                "--n",
                "16",
                "--n-confirm",
                "16",
                "--no-figures",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "single-head deposit: yes at" in out and "positional deposit: yes at" in out
    records = json.loads((neox / "dynamics.json").read_text())["records"]
    assert [r["step"] for r in records] == [0, 1, 2, 4, 8, 16]
    # GPT-NeoX's rotary heads are routes (moved through the bridge's hook_q/hook_k)
    assert all(r["positional"] is not None and "positional" in r["verdicts"] for r in records)
    assert all(all(all(row) for row in r["positional"]["routes"]) for r in records)


def test_architecture_training_is_deterministic_and_resumes_bit_for_bit(tmp_path):
    run = smoke_trainer(crash_at=5, arch="llama")
    whole = run(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", crash=True)
    resumed = run(tmp_path / "b", resume=True)
    assert whole.keys() == resumed.keys()
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
    digest = [
        hashlib.sha256((tmp_path / d / "model.safetensors").read_bytes()).hexdigest()
        for d in ("a", "b")
    ]
    assert digest[0] == digest[1]


@pytest.mark.parametrize("arch", ["gpt2", "bloom"])
def test_each_architecture_learns_past_chance_on_smoke(arch, tmp_path):
    result = pe_interp.train(
        preset="smoke", arch=arch, seed=0, out=tmp_path / arch, progress=False, epochs=10
    )
    run = load_run(tmp_path / arch)
    assert run.model.cfg.model_type == arch
    assert result.final["test_acc"] > 1.5 / run.task.n_classes  # chance is 1 / n_classes


@pytest.mark.parametrize("argv,pattern", [
    (["train", "--preset", "smoke", "--arch", "gpt3", "--out", "{t}/x"], r"ModelConfig.arch must be one of"),
    (["train", "--preset", "smoke", "--arch", "llama", "--encoding", "alibi", "--out", "{t}/x"],
     r"brings its own position encoding"),
    (["train", "--preset", "smoke", "--arch", "gpt2", "--silent-heads", "0:1", "--out", "{t}/x"],
     r"brings its own position encoding and heads"),
    (["train", "--preset", "smoke", "--arch", "gpt2", "--d-head", "4", "--out", "{t}/x"], r"\(d_head = d_model / n_heads\)"),
    (["generalize", "{run}"], r"which this probe reads of pe_interp's own model"),
])  # fmt: skip
def test_what_an_architecture_cannot_do_is_one_line(neox, tmp_path, argv, pattern, capsys):
    from bad_input_env import expect_cli_refusal

    expect_cli_refusal([a.format(t=tmp_path, run=neox) for a in argv], pattern, capsys)


def test_decompose_reads_an_architecture_run(neox, tmp_path, capsys):
    """GPT-NeoX's partial rotary heads through the bridge (tests/test_bridge_decomposition.py holds
    the terms to the bridge's scores and the direct term to the model run without rotation)."""
    import json
    import shutil

    from pe_interp.cli import main

    run = tmp_path / "neox"
    shutil.copytree(neox, run)
    assert main(["decompose", str(run), "--layer", "0", "--head", "1", "--no-figures"]) == 0
    assert "terms sum to the logits within" in capsys.readouterr().out
    saved = json.loads((run / "decompose_L0H1.json").read_text())
    assert (
        saved["max_error"] < 1e-4
        and saved["rope"] is not None
        and "content-content" in saved["terms"]
    )

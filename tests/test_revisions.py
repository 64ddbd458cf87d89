"""``pe-interp dynamics`` over another's training checkpoints (issue 38): a directory holding one
saved model per revision, as Pythia's revisions are once saved, walked in step order and checked
against a naive hook loop at every revision; a hub name's one-line errors offline."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pe_interp.cli import main
from pe_interp.models.bridge.hf_arch import build_hf_model, save_model_dir, word_tokenizer
from pe_interp.runs.model_dirs import load_model_dir

SHAPE = {
    "n_layers": 2,
    "d_model": 16,
    "n_heads": 2,
    "d_mlp": 32,
    "n_ctx": 16,
    "d_vocab": 38,
    "pad_id": 0,
}  # smoke, task 1
REVISIONS = {"step0": 0, "step16": 1, "step4": 2}  # revision -> the seed of its weights


@pytest.fixture(scope="module")
def revisions(tmp_path_factory):
    root = tmp_path_factory.mktemp("pythia-like")
    for name, seed in REVISIONS.items():
        save_model_dir(
            build_hf_model("gpt-neox", seed=seed, **SHAPE), word_tokenizer(38, 0), root / name
        )
    return root


def _naive_drops(model, test) -> np.ndarray:
    """Zero each head's hook_z in turn through the bridge's own run_with_hooks (accuracy drops)."""
    bridge, mask = model.bridge, test.pad_mask
    last = mask.sum(1) - 1
    answers = model.answers

    def acc(hooks=()):
        with torch.no_grad():
            logits = bridge.run_with_hooks(
                test.tokens, fwd_hooks=list(hooks), attention_mask=mask.long()
            )
        return float(
            (logits[torch.arange(len(last)), last][:, answers].argmax(1) == test.labels)
            .double()
            .mean()
        )

    base = acc()
    out = np.zeros((2, 2))
    for layer in range(2):
        for h in range(2):

            def zero(z, hook, h=h):
                z = z.clone()
                z[:, :, h] = 0.0
                return z

            out[layer, h] = base - acc([(f"blocks.{layer}.attn.hook_z", zero)])
    return out


def test_dynamics_walks_a_directory_of_revisions_in_step_order(revisions, capsys):
    argv = [
        "dynamics",
        str(revisions),
        "--task",
        "distance",
        "--preset",
        "smoke",
        "--n",
        "24",
        "--n-confirm",
        "40",
        "--no-figures",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert "3 snapshots (steps 0-16)" in capsys.readouterr().out
    saved = json.loads((revisions / "dynamics.json").read_text())
    records = saved["result"]["records"] if "result" in saved else saved["records"]
    assert [(r["step"], r["revision"]) for r in records] == [
        (0, "step0"),
        (4, "step4"),
        (16, "step16"),
    ]
    for r in records:
        run = load_model_dir(revisions / r["revision"], "distance", "smoke")
        test = run.examples("test", r["n_examples"])
        np.testing.assert_allclose(
            np.asarray(r["drops"], dtype=float), _naive_drops(run.model, test), atol=1e-9
        )
        assert r["verdicts"]["positional"]["verdict"] in (
            "yes",
            "no",
            "undecided",
        )  # GPT-NeoX's rotary heads move
    assert main(argv) == 0  # resumed: every revision kept, nothing measured again (its seconds too)
    again = json.loads((revisions / "dynamics.json").read_text())
    assert (again["result"]["records"] if "result" in again else again["records"]) == records
    assert main([*argv, "--revisions", "step4"]) == 0
    assert "1 snapshots (steps 4-4)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,pattern", [
    (["dynamics", "{d}/step0", "--task", "distance"], r"one saved model has no training snapshots"),
    (["dynamics", "{d}"], r"say which task to probe them on with --task"),
    (["dynamics", "{d}", "--task", "distance", "--preset", "smoke", "--revisions", "step8"],
     r"no saved model for revision\(s\) step8; it holds step0, step4, step16"),
    (["dynamics", "{d}", "--task", "distance", "--preset", "smoke", "--steps", "4"],
     r"--steps picks a run's snapshots; for checkpoints, name them with --revisions"),
    (["dynamics", "owner-x/no-such-model", "--task", "distance"], r"name the hub revisions to walk"),
    (["dynamics", "owner-x/no-such-model", "--task", "distance", "--revisions", "step1"],
     r"owner-x/no-such-model@step1: no local directory of that name, and the Hugging Face hub is off"),
])  # fmt: skip
def test_dynamics_over_checkpoints_refuses_in_one_line(
    revisions, argv, pattern, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(revisions.parent)  # runs/hub/ goes here
    assert main([a.replace("{d}", str(revisions)) for a in argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and __import__("re").search(pattern, err[0]), err

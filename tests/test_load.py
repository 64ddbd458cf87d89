"""One way to open any model (issue 53, item 3): ``pe_interp.load(source)`` for a run directory,
``RUN@STEP``, a Hugging Face directory and a GGUF file, each equal to the loader it dispatches to,
each accepted by the probes, each refused in one line where it cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gguf import tiny_llama, write_gguf

import pe_interp
import probes
from pe_interp.models.bridge.hf_arch import build_hf_model, save_model_dir, word_tokenizer
from pe_interp.models.protocol import ProbeModel
from pe_interp.runs import gguf as pg
from pe_interp.runs import gguf_file as gf
from pe_interp.runs.checkpoint import CheckpointError, load_run
from pe_interp.runs.model_dirs import load_model_dir

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "checkpoints" / "planted-single-yes"
SHAPE = dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=64, d_vocab=64, pad_id=0)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llama")
    return save_model_dir(build_hf_model("llama", seed=3, **SHAPE), word_tokenizer(64, 0), out)


def test_a_run_directory_loads_as_load_run_does():
    model = pe_interp.load(PLANTED)
    run = load_run(PLANTED)
    assert isinstance(model, ProbeModel) and not model.training
    assert _same_weights(model, run.model)
    assert model.origin.provenance == run.provenance and model.origin.source == str(PLANTED)
    assert model.origin.task.to_dict() == run.task.to_dict() and model.origin.tokenizer is None


def test_a_model_directory_loads_on_its_whole_vocabulary_or_on_a_task(llama_dir):
    model = pe_interp.load(llama_dir)
    assert isinstance(model, ProbeModel)
    assert model.cfg.n_classes == 64 and model.origin.task is None
    assert (
        model.origin.tokenizer is not None
        and model.origin.tokenizer.convert_ids_to_tokens(5) == "t5"
    )
    on_task = pe_interp.load(llama_dir, task="distance", preset="smoke")
    reference = load_model_dir(llama_dir, "distance", "smoke")
    assert on_task.origin.provenance == reference.provenance == model.origin.provenance
    assert on_task.cfg.n_classes == reference.model.cfg.n_classes < 64
    # the probes take it as it comes: labels are token ids
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 64, (6, 9), generator=g)
    labels = torch.randint(1, 64, (6,), generator=g)
    result = probes.ablate_heads(model, tokens, labels, n_bootstrap=20)
    naive = probes.ablate_heads_naive(model, tokens, labels)
    torch.testing.assert_close(
        torch.as_tensor(result.values), torch.as_tensor(naive.values), atol=1e-5, rtol=0
    )


def test_a_gguf_file_loads_as_its_converted_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(pg.CACHE_ENV, str(tmp_path / "cache"))
    path = write_gguf(tiny_llama(seed=2), tmp_path / "tiny.gguf")
    model = pe_interp.load(path)
    assert isinstance(model, ProbeModel)
    assert model.origin.provenance["source"]["file"] == str(path)
    assert model.origin.provenance["source"]["gguf"]["sha256"] == gf.file_sha256(path)
    again = pe_interp.load(pg.cache_root() / gf.file_sha256(path)[:16])
    assert again.origin.provenance["sha256"] == model.origin.provenance["sha256"]
    assert _same_weights(model, again)


@pytest.mark.parametrize(
    "source,kwargs,pattern",
    [
        ("runs/absent/r0", {}, r"runs/absent/r0: run directory not found"),
        ("owner/absent", {}, r"owner/absent@main: no local directory of that name"),
        (str(PLANTED) + "@7", {}, r"planted-single-yes"),
        (str(PLANTED), {"task": "distance"}, r"a pe-interp run knows its task"),
        ("{llama}@3", {}, r"a saved Hugging Face model has no snapshots"),
        ("{llama}", {"task": "sorting"}, r"task must be one of"),
    ],
)
def test_what_cannot_be_loaded_is_refused_in_one_line(
    llama_dir, monkeypatch, source, kwargs, pattern
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub name is looked up nowhere
    source = source.replace("{llama}", str(llama_dir))
    with pytest.raises((CheckpointError, ValueError), match=pattern) as err:
        pe_interp.load(source, **kwargs)
    assert "\n" not in str(err.value)

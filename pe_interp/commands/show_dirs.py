"""What ``pe-interp show`` and ``pe-interp report`` make of the directories the toolkit writes
besides runs and sweeps: a survey's findings (``pe-interp survey --out DIR``) and a saved Hugging
Face model directory (or a GGUF file) that commands wrote their results into."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A model directory's own files: not results.
MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "provenance.json",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
}


def is_survey_dir(path: Path) -> bool:
    """A survey's findings directory: no run config, and at least one step's file."""
    from pe_interp.report.survey import load_steps

    return path.is_dir() and not (path / "config.json").exists() and bool(load_steps(path))


def show_survey(path: Path) -> int:
    """A survey's steps, its short findings (the README block's lines) and where its report is."""
    from pe_interp.report.survey import STEPS, load_steps, readme_block

    steps = load_steps(path)
    done = [s for s in STEPS if s in steps]
    first = steps[done[0]] if done else next(iter(steps.values()))
    weights = first.get("weights") or {}
    source = weights.get("source") or {}
    model = (source.get("gguf") or {}).get("file") or source.get("hub") or source.get("weights")
    print(f"survey {path}  (pe-interp survey: where position lives in a pretrained model)")
    print(f"  model      {model}, weights sha256 {str(weights.get('sha256'))[:16]}…")
    print(f"  steps      {', '.join(done)}")
    for line in readme_block(path, steps).split("\n\n")[0].splitlines():
        print(f"  {line}")
    report = path / "SURVEY.md"
    state = "" if report.is_file() else " (not written yet)"
    print(f"report       {report}{state}; pe-interp report {path} rebuilds it from the findings")
    return 0


def model_summary(config: dict[str, Any]) -> str:
    """A saved model's shape, read from its ``config.json`` under the names architectures use."""

    def first(*names: str) -> Any:
        return next((config[n] for n in names if config.get(n) is not None), "?")

    return (
        f"{config.get('model_type')}: {first('num_hidden_layers', 'n_layer')} layers, "
        f"{first('num_attention_heads', 'n_head')} heads "
        f"({first('num_key_value_heads', 'num_attention_heads', 'n_head')} key/value heads), "
        f"d_model {first('hidden_size', 'n_embd', 'd_model')}, vocabulary "
        f"{first('vocab_size')}, context {first('max_position_embeddings', 'n_positions', 'seq_length')}"
    )


def show_model(given: Path) -> int:
    """A saved model directory (a GGUF file: its converted directory in the cache): its shape,
    where it came from, and the results commands wrote into it, each checked against its weights."""
    from pe_interp.runs.gguf import converted, gguf_provenance
    from pe_interp.runs.gguf_file import is_gguf_file
    from pe_interp.runs.model_dirs import WEIGHT_FILES, weight_files, weights_sha256

    path = given
    if is_gguf_file(given):
        path = converted(given)
        if path is None:
            print(f"GGUF file {given}: not converted yet")
            print(
                f"  pe-interp convert {given} converts it (once) and prints its directory; every "
                f"command that takes --task converts it too (pe-interp ablate {given} --task "
                "induction)"
            )
            return 0
    config = json.loads((path / "config.json").read_text())
    print(f"model {given}  (a saved Hugging Face model, not a pe-interp run)")
    if path != given:
        print(f"  converted  {path}")
    print(f"  shape      {model_summary(config)}")
    gguf = gguf_provenance(path)
    if gguf:
        print(
            f"  from GGUF  {gguf.get('file')} (sha256 {str(gguf.get('sha256'))[:16]}…, "
            f"{gguf.get('file_type')}), dequantised to {gguf.get('dequantised', 'fp32')}"
        )
    weights = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
    sha = None
    if weights is None:
        print("  weights    none (no model.safetensors or pytorch_model.bin)")
    else:
        files = weight_files(weights)
        sha = weights_sha256(files)
        size = sum(f.stat().st_size for f in files)
        print(f"  weights    {weights.name} ({size / 1e6:.1f} MB), sha256 {sha[:16]}…")
    results = sorted(
        p for p in path.glob("*.json") if p.name not in MODEL_FILES and not p.name.startswith(".")
    )
    if not results:
        print(
            f"results      none yet (pe-interp ablate, patch, routes, decompose and heads {given} "
            f"--task TASK write them here; pe-interp survey {given} --out DIR runs every probe)"
        )
        return 0
    print("results")
    for p in results:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            print(f"  {p.name:<28} (unreadable)")
            continue
        recorded = (data.get("weights") or {}).get("sha256") if isinstance(data, dict) else None
        kind = data.get("kind", "?") if isinstance(data, dict) else "?"
        mark = (
            "weights not recorded"
            if recorded is None
            else "of these weights"
            if recorded == sha
            else "STALE: of other weights"
        )
        print(f"  {p.name:<28} {kind}, {mark}")
    return 0


def model_report_refusal(given: Path) -> str:
    """What ``pe-interp report`` says of a model directory or GGUF file: which command reads it."""
    from pe_interp.runs.gguf_file import is_gguf_file

    what = "a GGUF model file" if is_gguf_file(given) else "a saved Hugging Face model"
    return (
        f"{given}: {what}, not a pe-interp run: pe-interp show {given} lists the results written "
        f"into it, and pe-interp survey {given} --out DIR writes a report of every probe on it "
        "(DIR/SURVEY.md)"
    )


__all__ = ["is_survey_dir", "model_report_refusal", "model_summary", "show_model", "show_survey"]

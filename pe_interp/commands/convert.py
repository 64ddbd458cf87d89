"""``pe-interp convert FILE.gguf``: convert a GGUF file once into a saved Hugging Face directory in
the cache (:func:`pe_interp.runs.gguf.convert_gguf`) and print that directory, alone on stdout, so that
``DIR=$(pe-interp convert FILE.gguf)`` works; what was done goes to stderr."""

from __future__ import annotations

import argparse
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a GGUF file into a saved Hugging Face directory (once; cached)",
        description="Convert a GGUF file (llama.cpp's checkpoint format) into a saved Hugging Face "
        "model directory, dequantised to fp32, with its tokenizer and a provenance.json; print the "
        "directory. The result is cached by the file's sha256 (PE_INTERP_CACHE, else "
        "~/.cache/pe-interp), so a second call returns at once; every command that reads a model "
        "directory also reads the GGUF file itself (pe-interp ablate FILE.gguf --task distance).",
    )
    p.add_argument("gguf_file", metavar="FILE.gguf", help="the GGUF file to convert")
    p.add_argument(
        "--cache",
        default=None,
        metavar="DIR",
        help="the directory of converted models (default: $PE_INTERP_CACHE/gguf, else "
        "~/.cache/pe-interp/gguf)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pe_interp.runs.gguf import PROVENANCE, convert_gguf, gguf_provenance

    t0, wall = time.perf_counter(), time.time()
    out = convert_gguf(args.gguf_file, args.cache)
    prov = gguf_provenance(out) or {}
    if (out / PROVENANCE).stat().st_mtime < wall:  # written before this call: a cache hit
        how = "converted before"
    else:
        types = ", ".join(f"{n} {t}" for t, n in sorted(prov.get("tensor_types", {}).items()))
        how = (
            f"converted in {time.perf_counter() - t0:.1f} s ({prov.get('file_type')}: {types} "
            "tensors, dequantised to fp32)"
        )
    print(f"{args.gguf_file}: {how}", file=sys.stderr)
    print(out)
    return 0

"""What a GGUF file (llama.cpp's single-file checkpoint) says about itself, read without loading a
weight: :func:`is_gguf_file` (its name or its magic), :func:`read_gguf` (the header's architecture,
quantisation types and parameter count, refusing a file that is not GGUF or is cut short in one
line) and :func:`file_sha256` (its identity in the conversion cache, :mod:`pe_interp.runs.gguf`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

from pe_interp.util.io import CorruptFileError

MAGIC = b"GGUF"

__all__ = ["MAGIC", "existing_file", "file_sha256", "is_gguf_file", "read_gguf"]


def is_gguf_file(path: str | Path) -> bool:
    """True when ``path`` names a GGUF file: a ``.gguf`` name (existing or not, so that a missing
    one is reported as a missing GGUF file), or a file that starts with the ``GGUF`` magic."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return not path.is_dir()
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def file_sha256(path: str | Path) -> str:
    """The sha256 of the file's bytes, hex, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_gguf(path: str | Path) -> dict[str, Any]:
    """What the file's header says, read with ``gguf.GGUFReader`` without loading a weight:
    ``{"architecture", "file_type", "tensor_types" (name -> count), "parameters", "fp32_bytes"}``.
    A one-line CorruptFileError when it is not GGUF or is truncated; FileNotFoundError if absent."""
    path = existing_file(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise CorruptFileError(
            f"{path}: not a GGUF file (it starts with {head!r}, not {MAGIC!r})"
            if head
            else f"{path}: not a GGUF file (it is empty)"
        )
    from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType

    try:
        reader = GGUFReader(path)
        tensors = [
            (t.name, t.tensor_type, int(t.n_elements), t.n_bytes, t.data) for t in reader.tensors
        ]
        arch = reader.fields["general.architecture"].contents()
        file_type = (
            reader.fields["general.file_type"].contents()
            if "general.file_type" in reader.fields
            else None
        )
    except KeyError as err:
        raise CorruptFileError(
            f"{path}: a GGUF file without {err.args[0]!r} in its header"
        ) from None
    except Exception as err:  # the reader's own errors on a cut or damaged file: one line
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise CorruptFileError(
            f"{path}: truncated or damaged GGUF file of {path.stat().st_size} bytes (gguf's reader: "
            f"{first[:160]})"
        ) from None
    short = [name for name, _, _, n_bytes, data in tensors if data.nbytes != n_bytes]
    if short or not tensors:
        raise CorruptFileError(
            f"{path}: truncated GGUF file (tensor {short[0]!r} runs past the end of the file)"
            if short
            else f"{path}: a GGUF file without tensors"
        )
    n = sum(count for _, _, count, _, _ in tensors)
    return {
        "architecture": str(arch),
        "file_type": _enum_name(LlamaFileType, file_type),
        "tensor_types": dict(Counter(_enum_name(GGMLQuantizationType, t[1]) for t in tensors)),
        "parameters": n,
        "fp32_bytes": 4 * n,
    }


def existing_file(path: str | Path) -> Path:
    """``path`` as a Path if it is a file; a one-line FileNotFoundError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: file not found" if not path.exists() else f"{path}: not a file"
        )
    return path


def _enum_name(enum: Any, value: Any) -> str | None:
    """``value``'s name in ``enum`` (``MOSTLY_Q4_1``, ``Q8_0``), its number as text if unknown."""
    if value is None:
        return None
    try:
        return enum(int(value)).name
    except ValueError:
        return str(value)

"""A saved model's weight files: which they are, their hash and parameter count, whether they fit in
memory, and whether they are whole and finite (each a one-line refusal before the first forward)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pe_interp.runs.checkpoint import CheckpointError
from pe_interp.runs.gguf import GIB, MEMORY_FACTOR, MEMORY_MARGIN
from pe_interp.util.hardware import available_memory

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_weight_files(files: list[Path], where: Any) -> None:
    """A one-line CheckpointError, before the boot, for a weights file that is damaged: a
    safetensors file whose header does not parse or whose tensors the file does not hold
    (truncated), a ``.bin`` file that is empty, neither zip nor pickle, or a zip archive that is
    truncated or fails its checksums."""
    import zipfile

    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            if f.suffix == ".safetensors":
                with safe_open(str(f), framework="pt") as handle:
                    handle.keys()
            else:  # torch.save's zip archive, or its legacy pickle (not checked further)
                with open(f, "rb") as fh:
                    head = fh.read(4)
                if head.startswith(b"PK"):
                    with zipfile.ZipFile(f) as archive:  # BadZipFile: truncated
                        bad = archive.testzip()
                    if bad is not None:
                        raise ValueError(f"{bad} fails its checksum")
                elif not head.startswith(b"\x80"):
                    raise ValueError(
                        "neither a zip archive nor a pickle" if head else "it is empty"
                    )
        except (SafetensorError, OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CheckpointError(
                f"{where}: the weights file {f.name} is damaged ({first[:160]}); save or "
                "download the model again"
            ) from None


def check_finite(bridge: Any, where: Any, fix: str = "save or download the model again") -> None:
    """A one-line CheckpointError, after the boot and before any forward, for a NaN or inf weight
    (named as the saved model names it): every probe would read it as a result (an accuracy of
    0, drops of NaN). ``fix``: what to do, as fits where the weights came from."""
    from pe_interp.util.checks import nonfinite_weight

    bad = nonfinite_weight(getattr(bridge, "original_model", None) or bridge)
    if bad is None:
        return
    name = bad[0].replace("._original_component", "")
    raise CheckpointError(
        f"{where}: the weights hold {bad[1]} (in {name}): the file is damaged or the model it "
        f"was saved from diverged; {fix}"
    )


def weight_files(weights: Path) -> list[Path]:
    """The files holding the weights: ``weights`` itself, or the shards a ``*.index.json`` maps
    (one-line CheckpointError for a shard that is missing or an index that is not one)."""
    if not weights.name.endswith(".index.json"):
        return [weights]
    try:
        names = sorted(set(json.loads(weights.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{weights}: not a weights index (no weight_map)") from None
    missing = [n for n in names if not (weights.parent / n).is_file()]
    if missing or not names:
        raise CheckpointError(f"{weights}: the shard {missing[0] if missing else '?'} is missing")
    return [weights.parent / n for n in names]


def weights_sha256(files: list[Path]) -> str:
    """sha256 of the files' bytes in order, read in 16-MiB blocks."""
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while block := fh.read(1 << 24):
                h.update(block)
    return h.hexdigest()


def weight_count(weights: Path) -> int | None:
    """Parameters in a ``.safetensors`` file, read from its header (8 bytes of length, then JSON
    naming each tensor's shape) without loading a tensor; None for any other file."""
    if weights.suffix != ".safetensors":
        return None
    with open(weights, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    count = 0
    for name, entry in header.items():
        if name != "__metadata__":
            n = 1
            for dim in entry["shape"]:
                n *= int(dim)
            count += n
    return count


def check_memory(files: list[Path], where: Any) -> None:
    """A one-line CheckpointError, before the boot, when the model would not fit in memory: its
    weights in fp32 (the parameters of the safetensors headers, or a ``.bin`` file's own size)
    about twice over (the Hugging Face model and the bridge around it, as converting a GGUF
    needs), and Python, torch and transformers themselves (:data:`pe_interp.runs.gguf.MEMORY_MARGIN`)."""
    counts = [weight_count(f) for f in files]
    count = None if None in counts else sum(counts)
    fp32 = 4 * count if count is not None else sum(f.stat().st_size for f in files)
    need, free = MEMORY_FACTOR * fp32 + MEMORY_MARGIN, available_memory()
    if free is not None and need > free:
        what = f"{count / 1e6:.1f}M parameters" if count is not None else "its weight files"
        raise CheckpointError(
            f"{where}: booting it needs about {need / GIB:.1f} GiB of memory "
            f"({what} in fp32, {fp32 / GIB:.2f} GiB), and {free / GIB:.1f} GiB is available"
        )


__all__ = [
    "WEIGHT_FILES",
    "check_finite",
    "check_memory",
    "check_weight_files",
    "weight_count",
    "weight_files",
    "weights_sha256",
]

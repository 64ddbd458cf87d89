"""A GGUF file (llama.cpp's single-file checkpoint) as a saved Hugging Face directory, converted
once into a cache and read like any other model directory (:mod:`pe_interp.runs.model_dirs`).

:func:`convert_gguf` checks the file first and refuses in one line, writing nothing, when it is not
GGUF (no ``GGUF`` magic), is truncated, names an architecture ``transformers`` cannot load from
GGUF, or would not fit in memory once dequantised (its fp32 size from the tensor shapes, before
anything is loaded). It then loads the file with ``transformers`` (every tensor dequantised to
fp32), saves the model and its tokenizer with ``save_pretrained`` into a temporary directory with
a ``provenance.json`` (:func:`gguf_provenance`: the file's name, sha256, size and quantisation
types, ``"dequantised": "fp32"``, the library versions) and renames it into place, so a crash never
leaves half a cache. The cache is ``<root>/<sha256[:16]>/``; the root is the ``cache_dir``
argument, else ``$PE_INTERP_CACHE/gguf``, else ``$XDG_CACHE_HOME/pe-interp/gguf`` (by default
``~/.cache/pe-interp/gguf``). A file converted before is not converted again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from pe_interp.util.io import CorruptFileError, atomic_write_json, check_writable_dir, read_json

MAGIC = b"GGUF"
PROVENANCE = "provenance.json"
CACHE_ENV = "PE_INTERP_CACHE"
# What converting needs: the dequantised weights about twice (the loaded model, the file being
# written), and Python, torch and transformers themselves (converting SmolLM2-135M, 0.50 GiB in
# fp32, peaked at 1.3 GiB resident; this asks for 2.0 GiB).
MEMORY_FACTOR = 2.0
MEMORY_MARGIN = 1 << 30
GIB = float(1 << 30)

__all__ = [
    "CACHE_ENV",
    "MAGIC",
    "PROVENANCE",
    "available_memory",
    "cache_root",
    "convert_gguf",
    "converted",
    "file_sha256",
    "gguf_provenance",
    "is_gguf_file",
    "read_gguf",
]


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


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The directory that holds the converted models: ``cache_dir``, else ``$PE_INTERP_CACHE/gguf``,
    else ``$XDG_CACHE_HOME/pe-interp/gguf`` (``~/.cache/pe-interp/gguf``)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser() / "gguf"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "pe-interp" / "gguf"


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
    path = _a_file(path)
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


def _a_file(path: str | Path) -> Path:
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


def available_memory() -> int | None:
    """Bytes of memory this process may still take: ``MemAvailable`` of ``/proc/meminfo`` (else
    ``os.sysconf``'s available pages), bounded by a cgroup v2 limit; None when neither is known."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    if not found:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError):
        group = Path("/sys/fs/cgroup")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((group / "memory.current").read_text()))
    return min(found) if found else None


def _loadable(arch: str) -> bool:
    """Whether ``transformers`` has a GGUF loader for ``arch`` (its name as llama.cpp writes it)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    names = set(GGUF_SUPPORTED_ARCHITECTURES)
    try:
        from transformers.integrations.gguf import is_gguf_arch_supported
    except ImportError:  # transformers before its packed GGUF loader
        is_gguf_arch_supported = lambda _: False  # noqa: E731
    spellings = {arch, arch.replace("-", "_"), re.sub(r"(\d)moe$", r"\1_moe", arch)}
    if arch.startswith("t5"):
        spellings.add("t5")
    return bool(spellings & names) or is_gguf_arch_supported(arch)


def _check(path: Path, info: dict[str, Any]) -> None:
    """One line when transformers cannot load the architecture, or the fp32 weights would not fit."""
    import transformers

    arch = info["architecture"]
    if not _loadable(arch):
        raise ValueError(
            f"{path}: transformers {transformers.__version__} cannot load architecture {arch!r} "
            "from GGUF; convert the original checkpoint with save_pretrained instead"
        )
    need, free = MEMORY_FACTOR * info["fp32_bytes"] + MEMORY_MARGIN, available_memory()
    if free is not None and need > free:
        raise ValueError(
            f"{path}: converting it needs about {need / GIB:.1f} GiB of memory "
            f"({info['parameters'] / 1e6:.1f}M parameters dequantised to fp32, "
            f"{info['fp32_bytes'] / GIB:.2f} GiB), and {free / GIB:.1f} GiB is available"
        )


def gguf_provenance(model_dir: str | Path) -> dict[str, Any] | None:
    """The ``provenance.json`` of a directory converted from GGUF (what every result of it can
    record: the file's name, sha256, size, quantisation types, ...); None for any other directory."""
    path = Path(model_dir) / PROVENANCE
    if not path.is_file():
        return None
    data = read_json(path)
    return data if isinstance(data, dict) and "sha256" in data else None


def convert_gguf(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The saved Hugging Face directory of the GGUF file at ``path``: ``<root>/<sha256[:16]>/``
    (:func:`cache_root`), converted now unless an earlier call did. A one-line ValueError (nothing
    written) for a file that is not GGUF, is truncated, cannot be loaded or would not fit in memory,
    or a cache that cannot be written (checked before the de-quantising)."""
    path = _a_file(path)
    sha = file_sha256(path)
    root = cache_root(cache_dir)
    out = root / sha[:16]
    if _complete(out, sha):
        return out
    info = read_gguf(path)
    _check(path, info)
    check_writable_dir(  # before the de-quantising, not at the first write after it
        root,
        f"{path}: the cache",
        "give --cache a directory you can write"
        if cache_dir is not None
        else f"set {CACHE_ENV} to a directory you can write",
    )
    model, tokenizer = _load(path, info)
    provenance = _provenance(path, sha, info)
    root.mkdir(parents=True, exist_ok=True)
    _remove_strays(root, sha[:16])
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{sha[:16]}.{os.getpid()}.", suffix=".tmp"))
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700, as a directory made by mkdir would be
        _save_converted(model, tokenizer, tmp)
        atomic_write_json(tmp / PROVENANCE, provenance)
        for file in tmp.iterdir():  # on disk before the directory is renamed into place
            with open(file, "rb") as f:
                os.fsync(f.fileno())
        if out.exists() and not _complete(out, sha):  # a damaged cache: replaced
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if not _complete(out, sha):  # another process renamed its own copy first: keep it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def converted(path: str | Path, cache_dir: str | Path | None = None) -> Path | None:
    """The directory the GGUF file at ``path`` was converted into, or None where it has not been
    (nothing is converted here)."""
    sha = file_sha256(_a_file(path))
    out = cache_root(cache_dir) / sha[:16]
    return out if _complete(out, sha) else None


def _complete(out: Path, sha: str) -> bool:
    """Whether ``out`` is a whole conversion of the file whose sha256 is ``sha``."""
    try:
        recorded = gguf_provenance(out)
    except ValueError:
        return False
    weights = (out / "model.safetensors").is_file() or (
        out / "model.safetensors.index.json"
    ).is_file()
    return bool(
        recorded and recorded.get("sha256") == sha and weights and (out / "config.json").is_file()
    )


def _remove_strays(root: Path, key: str) -> None:
    """Remove the temporary directories of conversions of this file whose process is gone
    (killed mid-conversion); a live one's is left alone."""
    for stray in root.glob(f".{key}.*.tmp"):
        pid = stray.name.split(".")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stray, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _provenance(path: Path, sha: str, info: dict[str, Any]) -> dict[str, Any]:
    """What ``provenance.json`` records of the file and of the conversion."""
    import gguf
    import transformers

    return {
        "file": path.name,
        "sha256": sha,
        "size": path.stat().st_size,
        "architecture": info["architecture"],
        "file_type": info["file_type"],
        "tensor_types": info["tensor_types"],
        "parameters": info["parameters"],
        "dequantised": "fp32",
        "transformers": transformers.__version__,
        "gguf": getattr(gguf, "__version__", None) or _version("gguf"),
    }


def _version(package: str) -> str | None:
    """The installed version of ``package``; None if it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _load(path: Path, info: dict[str, Any]) -> tuple[Any, Any]:
    """The file's model (every weight dequantised to fp32) and tokenizer, loaded by transformers.
    Its config comes first and builds the model on the meta device: one line, before any weight
    is loaded, when the config describes more parameters than the file holds (a header without
    its shape makes transformers fill in a default, up to 7B parameters of random weights), when it
    is no causal language model, or when transformers cannot load it; and after, when a weight of
    the model was not in the file, or when a weight is NaN or inf."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from pe_interp.util.checks import nonfinite_weight

    extra: dict[str, Any] = {"dtype": torch.float32, "output_loading_info": True}
    if hasattr(transformers, "GgufConfig"):  # unpack every weight, whatever kernels are installed
        extra["quantization_config"] = transformers.GgufConfig(dequantize=True)
    where, name = str(path.resolve().parent), path.name
    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # one line per error on the command line, no loading bars
    gguf_utils = _quiet_gguf_bar()
    what = "config"
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        what = "model"
        with torch.device("meta"):
            n = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if n > info["parameters"]:
            raise _Refused(
                f"{path}: its header describes a model of {n:,} parameters and the file holds "
                f"{info['parameters']:,}: a damaged or partial GGUF file"
            )
        model, loading = AutoModelForCausalLM.from_pretrained(
            where, gguf_file=name, config=config, **extra
        )
        if loading["missing_keys"]:
            missing = sorted(loading["missing_keys"])
            raise _Refused(
                f"{path}: the file lacks {len(missing)} weight(s) of its {type(model).__name__} "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
            )
        bad = nonfinite_weight(model)
        if bad is not None:  # a damaged file: refused before anything is cached
            raise _Refused(
                f"{path}: the weights hold {bad[1]} (in {bad[0]}): the file is damaged or the "
                "model it was saved from diverged; download the GGUF file again"
            )
        what = "tokenizer"
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except _Refused as err:
        raise ValueError(str(err)) from None
    except Exception as err:  # an unsupported architecture or tokenizer, a damaged tensor: one line
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"{path}: transformers {transformers.__version__} could not load its {what} from GGUF "
            f"({first[:200]})"
        ) from None
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        if gguf_utils is not None:
            gguf_utils.tqdm = gguf_utils.__dict__.pop("_pe_interp_tqdm", gguf_utils.tqdm)
    return model.eval(), tokenizer


def _quiet_gguf_bar() -> Any:
    """transformers' GGUF loader draws its de-quantising bar with ``tqdm.auto`` itself, past its
    own progress-bar switch: silenced here for the load (the module, to restore it after)."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - transformers without GGUF support
        return None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        return None
    gguf_utils._pe_interp_tqdm = bar
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    return gguf_utils


class _Refused(Exception):
    """A refusal of :func:`_load`'s own, told apart from transformers' errors."""


def _save_converted(model: Any, tokenizer: Any, out: Path) -> None:
    """Save the loaded model and its tokenizer into ``out`` with ``save_pretrained``: the weights
    go into a fresh model of the same class (no GGUF quantisation config, which save_pretrained
    refuses), built on the meta device and given the loaded tensors, so nothing is copied."""
    import torch

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = model.state_dict()
    with torch.device("meta"):
        fresh = type(model)(config)
    fresh.load_state_dict(state, strict=True, assign=True)
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)

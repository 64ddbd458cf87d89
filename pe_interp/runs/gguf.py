"""A GGUF file (llama.cpp's single-file checkpoint) as a saved Hugging Face directory, converted
once into a cache and read like any other model directory (:mod:`pe_interp.runs.model_dirs`).

:func:`convert_gguf` checks the file first and refuses in one line, writing nothing, when it is not
GGUF (no ``GGUF`` magic), is truncated (its header, read by :mod:`pe_interp.runs.gguf_file`), names
an architecture ``transformers`` cannot load from GGUF, or would not fit in memory once dequantised
(its fp32 size from the tensor shapes, before anything is loaded). It then loads the file with
``transformers`` (every tensor dequantised to fp32), saves the model and its tokenizer with ``save_pretrained`` into a temporary directory with
a ``provenance.json`` (:func:`gguf_provenance`: the file's name, sha256, size and quantisation
types, ``"dequantised": "fp32"``, the library versions) and renames it into place, so a crash never
leaves half a cache. The cache is ``<root>/<sha256[:16]>/``; the root is the ``cache_dir``
argument, else ``$PE_INTERP_CACHE/gguf``, else ``$XDG_CACHE_HOME/pe-interp/gguf`` (by default
``~/.cache/pe-interp/gguf``). A file converted before is not converted again.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pe_interp.runs.gguf_file import existing_file, file_sha256, read_gguf
from pe_interp.util.hardware import available_memory
from pe_interp.util.io import atomic_write_json, check_writable_dir, read_json

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
    "PROVENANCE",
    "cache_root",
    "convert_gguf",
    "converted",
    "gguf_provenance",
]


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The directory that holds the converted models: ``cache_dir``, else ``$PE_INTERP_CACHE/gguf``,
    else ``$XDG_CACHE_HOME/pe-interp/gguf`` (``~/.cache/pe-interp/gguf``)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser() / "gguf"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "pe-interp" / "gguf"


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
    path = existing_file(path)
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
    sha = file_sha256(existing_file(path))
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
    refuses), built on the meta device and given the loaded tensors, so nothing is copied. No
    progress bar ("Writing model shards"): a command's stderr holds its own lines only."""
    import torch
    from transformers.utils import logging as hf_logging

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = model.state_dict()
    with torch.device("meta"):
        fresh = type(model)(config)
    fresh.load_state_dict(state, strict=True, assign=True)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        fresh.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)

"""The one place where files are written and read: atomic writes, strict JSON, and JSONL.

- **Atomic**: every file is written to a temporary name in its directory, flushed to disk and
  renamed into place, so a reader sees the old file or the new one, never half of one.
- **NaN ↔ null**: JSON has no NaN. :func:`to_json` turns NaN and ±inf floats (Python, NumPy or
  torch, scalars or arrays) into ``null``; :func:`nan_array` and :func:`nan_float` turn ``null``
  back into NaN when a result is loaded. Files written before this module existed may hold the
  ``NaN`` literal, which :func:`read_json` still parses.
- **JSONL**: one JSON object per line, appended as the run goes. A crash mid-append can leave a
  torn last line; :func:`read_jsonl` skips an unparsable *last* line and raises on any other.
- **Result files**: a probe result is saved with its kind (``{"kind": "ablation", ...}``,
  :func:`write_result`) and loaded by :func:`load_result`, which says in one line when a file
  holds another kind of result, a JSON list, or a truncated text. Files from before the tag are
  recognised by the keys their kind always has (:func:`register_result`), so they still load.
- **Paths**: a file path that is a directory, or that runs through a file, is refused in one
  line before anything is written (:func:`check_file_path`); so is a destination directory this
  process cannot write (:func:`check_writable_dir`), which commands check before their work.
- **One writer**: :func:`dir_lock` holds an OS-level lock (``filelock``) on a run or sweep
  directory while it is written; a second writer gets a one-line :class:`LockedError`. The lock
  file (:data:`LOCK_FILE`, hidden) stays in place; the OS releases the lock when its process dies,
  even by SIGKILL, so a killed run never blocks its resume. Taking the lock removes the temporary
  files a killed writer left (:func:`remove_stray_temps`). It lives in :mod:`pe_interp.util.locks`.

Every probe result's ``save``/``load``, the run directory, the sweep and the report go through here.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.util.locks import LOCK_FILE, LockedError, dir_lock, remove_stray_temps

__all__ = [
    "CorruptFileError",
    "LOCK_FILE",
    "LockedError",
    "RESULT_KINDS",
    "append_jsonl",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_file_path",
    "check_writable_dir",
    "dir_lock",
    "load_result",
    "nan_array",
    "nan_float",
    "read_json",
    "read_jsonl",
    "read_result",
    "register_result",
    "remove_stray_temps",
    "to_json",
    "write_jsonl",
    "write_result",
]


class CorruptFileError(ValueError):
    """A file exists but cannot be parsed (the message names the file and the line)."""


# ---- atomic writes ----------------------------------------------------------------------------
def check_file_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if a file can be written there: not a directory, and no parent is a
    file; a one-line ValueError otherwise (the OS would say "File exists" or "Is a directory")."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{path} is a directory; give a file path inside it, such as {path / 'result.json'}"
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(
                    f"cannot write {path}: {parent} is a file, not a directory; choose another path"
                )
            break
    return path


def writable(directory: Path) -> bool:
    """Whether this process may create files in the existing ``directory`` (``access(2)``: the
    permission bits and ACLs for its user, and a read-only file system for every user, root too)."""
    return os.access(directory, os.W_OK | os.X_OK)


def check_writable_dir(
    path: str | os.PathLike[str],
    what: str = "--out",
    hint: str = "choose a directory you can write, or make it writable",
) -> Path:
    """``path`` as a Path if the directory can be written there: it is a directory, or the first of
    its parents that exists is one, and this process may create files in it. A one-line
    ValueError otherwise, named by ``what`` (the flag), so that a command refuses before its work
    rather than losing it at the first write (an empty ``what``: the path alone names it).
    Nothing is created."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}: exists and is not a directory; give a directory")
    base = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not base.is_dir():
        raise ValueError(f"{name}: {base} is a file, not a directory; choose another path")
    if not writable(base):
        try:
            read_only = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        why = "on a read-only file system" if read_only else "not writable by this user"
        where = why if base == path else f"{base} is {why}"
        raise ValueError(f"{name}: cannot write there ({where}); {hint}")
    return path


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path in ``path``'s directory to write the file to; on a clean exit it is
    flushed to disk and renamed onto ``path``, on an exception it is removed::

        with atomic_path(run_dir / "model.safetensors") as tmp:
            save_file(tensors, tmp)
    """
    path = check_file_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`); returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, sort_keys: bool = True
) -> Path:
    """``obj`` as strict JSON (NaN/inf as null, see :func:`to_json`), atomically, ending in a
    newline."""
    text = json.dumps(to_json(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)
    return atomic_write_text(path, text + "\n")


# ---- NaN <-> null ----------------------------------------------------------------------------
def to_json(x: Any) -> Any:
    """``x`` with NaN/inf floats as None, tuples as lists, NumPy/torch scalars and arrays as
    Python numbers and nested lists, and dict keys as strings."""
    if isinstance(x, bool) or x is None or isinstance(x, str | int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_json(v) for v in x]
    if isinstance(x, np.generic):
        return to_json(x.item())
    if isinstance(x, np.ndarray):
        return to_json(x.tolist())
    if hasattr(x, "detach") and hasattr(x, "tolist"):  # a torch tensor
        return to_json(x.detach().cpu().tolist())
    return x


def nan_float(x: Any) -> float:
    """A float from a loaded JSON value, with None as NaN."""
    return math.nan if x is None else float(x)


def nan_array(x: Any) -> np.ndarray | None:
    """A float64 array from nested lists with None as NaN (None stays None)."""
    if x is None:
        return None

    def fill(v: Any) -> Any:
        if isinstance(v, list):
            return [fill(u) for u in v]
        return math.nan if v is None else v

    return np.array(fill(x), dtype=np.float64)


# ---- reading ------------------------------------------------------------------------------
def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file; FileNotFoundError if it is missing, CorruptFileError if unparsable."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CorruptFileError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError as err:
        raise CorruptFileError(
            f"{path}: not a JSON text file (byte {err.start} is not UTF-8)"
        ) from None


# ---- JSONL ---------------------------------------------------------------------------------
def _lines(records: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(to_json(r), allow_nan=False) + "\n" for r in records)


def append_jsonl(
    path: str | os.PathLike[str], records: dict[str, Any] | Iterable[dict[str, Any]]
) -> None:
    """Append one record (or several) to a JSONL file, one line each, in one write."""
    if isinstance(records, dict):
        records = [records]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(_lines(records))
        f.flush()


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> Path:
    """Replace a JSONL file atomically (e.g. when a resumed run drops records after its step)."""
    return atomic_write_text(path, _lines(records))


def read_jsonl(path: str | os.PathLike[str], *, missing_ok: bool = False) -> list[dict[str, Any]]:
    """The records of a JSONL file. Blank lines are skipped; so is an unparsable **last** line
    (the only line a crash mid-append can tear); any other bad line raises CorruptFileError. A
    missing file is ``[]`` with ``missing_ok``, else FileNotFoundError."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return []
        raise FileNotFoundError(f"{path}: file not found")
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as err:
        raise CorruptFileError(
            f"{path}: not a JSONL text file (byte {err.start} is not UTF-8)"
        ) from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise CorruptFileError(f"{path}: invalid JSON on line {i}") from None
    return out


# ---- probe result files ----------------------------------------------------------------------
# kind -> (the class that loads it, the keys every file of that kind holds); filled by each
# result class's module (register_result), read to recognise files saved before the kind tag.
RESULT_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {}


def register_result(kind: str, loader: str, keys: Iterable[str]) -> str:
    """Declare a kind of result file: ``loader`` names what loads it (``"AblationResult.load"``),
    ``keys`` are those its files always hold. Returns ``kind``."""
    RESULT_KINDS[kind] = (loader, tuple(keys))
    return kind


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def write_result(
    path: str | os.PathLike[str], kind: str, data: dict[str, Any], **kwargs: Any
) -> Path:
    """``data`` with ``"kind": kind`` first, as :func:`atomic_write_json` writes it."""
    return atomic_write_json(path, {"kind": kind, **data}, **kwargs)


def read_result(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """The dict of a result file of ``kind`` (without its tag); a one-line ValueError when it
    is a directory, not JSON (truncated), not an object, or a result of another kind."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not {_a(kind)} result file")
    try:
        data = read_json(path)
    except CorruptFileError as err:
        raise CorruptFileError(
            f"{err}; the file is truncated or damaged, not a readable {kind} result: run the probe "
            "again"
        ) from None
    if not isinstance(data, dict):
        what = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
            type(data), "number"
        )
        raise ValueError(f"{path} is a JSON {what}, not {_a(kind)} result")
    tag = data.get("kind")
    if isinstance(tag, str) and tag in RESULT_KINDS or tag == kind:
        if tag != kind:
            raise ValueError(
                f"{path} is {_a(tag)} result, not {_a(kind)} result; load it with "
                f"{RESULT_KINDS[tag][0]}"
            )
        return {k: v for k, v in data.items() if k != "kind"}
    # a file from before the tag: known by its keys
    keys = RESULT_KINDS[kind][1] if kind in RESULT_KINDS else ()
    missing = [k for k in keys if k not in data]
    if missing:
        others = [
            k
            for k, (_, ks) in RESULT_KINDS.items()
            if k != kind and ks and all(x in data for x in ks)
        ]
        if others:
            raise ValueError(
                f"{path} is {_a(others[0])} result, not {_a(kind)} result; load it with "
                f"{RESULT_KINDS[others[0]][0]}"
            )
        raise ValueError(f"{path} is not {_a(kind)} result (it has no {missing[0]!r} key)")
    return data


def load_result(path: str | os.PathLike[str], kind: str, from_dict: Any) -> Any:
    """``from_dict(read_result(path, kind))``, with a damaged file's error on one line."""
    data = read_result(path, kind)
    try:
        return from_dict(data)
    except KeyError as err:
        raise ValueError(f"{path}: a damaged {kind} result (no {err.args[0]!r} key)") from None
    except (TypeError, ValueError, IndexError, AttributeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path}: a damaged {kind} result ({first})") from None

"""One writer per directory: an OS-level lock on a run or sweep directory while it is written.

:func:`dir_lock` holds a ``filelock`` lock on the directory's hidden :data:`LOCK_FILE`; a second
writer gets a one-line :class:`LockedError` naming the holder. The OS releases the lock when its
process dies, even by SIGKILL, so a killed run never blocks its resume; taking the lock removes the
temporary files a killed writer left (:func:`remove_stray_temps`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

__all__ = ["LOCK_FILE", "LockedError", "dir_lock", "remove_stray_temps"]


LOCK_FILE = ".pe-interp.lock"
# atomic_path's temporary names: "." + the file's name + "." + mkstemp's 8 random characters + ".tmp"
_TEMP = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
_HELD: dict[str, list[Any]] = {}  # lock path -> [FileLock, depth]: re-entrant within a process


class LockedError(ValueError):
    """Another process is writing the directory (the message names it and what to do)."""


def remove_stray_temps(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files of :func:`atomic_path` that a killed writer left in
    ``directory`` and its sub-directories, except those that are locked units of their own
    (a sweep's run directories); returns what was removed. Call it only while holding the lock."""
    root, removed = Path(directory), []
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (Path(here) / d / LOCK_FILE).exists()]
        for name in files:
            if _TEMP.match(name):
                (Path(here) / name).unlink(missing_ok=True)
                removed.append(Path(here) / name)
    return removed


def _holder(path: Path) -> str:
    """Who holds the lock, as its holder recorded it (empty when unreadable)."""
    try:
        info = json.loads(path.read_text())
        return f" (pid {int(info['pid'])}: {str(info['command'])[:120]}, since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _program() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return "pe-interp" if name in ("cli.py", "__main__.py") else name


@contextmanager
def dir_lock(
    directory: str | os.PathLike[str],
    what: str = "directory",
    timeout: float = 0.0,
    hint: str = "wait for it to end, or use another directory",
) -> Iterator[Path]:
    """Hold ``directory``'s lock (creating the directory) while the block writes into it.

    Re-entrant within a process (a sweep cell holds its run's lock while ``train`` takes it
    again); another process holding it for ``timeout`` seconds raises a one-line
    :class:`LockedError` naming that process. On first acquisition the stray temporary files
    of a killed writer are removed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    key = str(path.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield directory
        finally:
            _HELD[key][1] -= 1
        return
    lock = FileLock(key, timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise LockedError(
            f"{directory}: another process is writing this {what}{_holder(path)}; {hint}"
        ) from None
    _HELD[key] = [lock, 1]
    try:
        with open(path, "w") as f:  # in place: the lock is on this inode (flock, not replaced)
            f.write(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "command": " ".join([_program(), *sys.argv[1:]]),
                        "since": datetime.datetime.now().isoformat(timespec="seconds"),
                    }
                )
            )
        remove_stray_temps(directory)
        yield directory
    finally:
        del _HELD[key]
        lock.release()

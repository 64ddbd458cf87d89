"""Stopping cleanly on SIGINT and SIGTERM.

- :func:`deferred`: inside it, SIGINT and SIGTERM only record that a stop was asked for; the
  training loop looks at :func:`requested` between two steps, saves a checkpoint and raises
  :class:`Interrupted`. A second signal stops at once (the usual second Ctrl-C).
- :func:`sigterm_raises`: inside it, SIGTERM raises :class:`Interrupted` where the program is,
  as SIGINT raises KeyboardInterrupt, so that ``finally`` blocks run (locks released, temporary
  files removed) instead of the process vanishing.

Both act only in the main thread (Python delivers signals there) and leave a signal that is set
to be ignored (``SIG_IGN``, as ``nohup`` or a sweep's worker processes set SIGINT) ignored.
SIGKILL cannot be caught: what it leaves is made safe by atomic writes, OS-level locks and
checkpoints (see :mod:`pe_interp.util.io` and :mod:`pe_interp.training.trainer`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Interrupted", "deferred", "exit_code", "requested", "signal_name", "sigterm_raises"]

_STOP: list[int] = []  # the signals that asked this process to stop, in order


class Interrupted(KeyboardInterrupt):
    """Stopped by a signal after saving what there was to save; ``str()`` says how to go on
    (empty when the caller should say it), ``signum`` is the signal."""

    def __init__(self, message: str = "", signum: int = signal.SIGINT):
        super().__init__(message)
        self.message, self.signum = message, int(signum)

    def __reduce__(self):  # crosses process boundaries (a sweep's workers)
        return type(self), (self.message, self.signum)

    def __str__(self) -> str:
        return self.message


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """The shell's convention for a process stopped by a signal: 128 + its number."""
    return 128 + int(signum)


def requested() -> int | None:
    """The signal that asked this process to stop (inside :func:`deferred`), or None."""
    return _STOP[0] if _STOP else None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def deferred(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Within the block, the first of ``signals`` is recorded (:func:`requested`), the second
    raises :class:`Interrupted` at once. Earlier requests are forgotten on entry; the previous
    handlers come back afterwards."""
    if not _main_thread():
        yield
        return
    _STOP.clear()

    def handler(signum, frame):
        if _STOP:
            raise Interrupted("", signum)
        _STOP.append(signum)

    previous = {}
    for sig in signals:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Interrupted` (``signum`` SIGTERM)."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return

    def handler(signum, frame):
        _STOP.append(signum)
        raise Interrupted("", signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

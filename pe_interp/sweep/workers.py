"""The local backend's worker processes and how a sweep stops them (see
:mod:`pe_interp.sweep.executors`).

A worker ignores Ctrl-C (the terminal sends it to the whole process group; the parent decides),
gets SIGTERM when its parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``), so that no
orphan goes on writing a cell. The parent stops its workers with SIGTERM: a training cell saves
a checkpoint at its step and the worker exits (:mod:`pe_interp.util.interrupts`,
``pe_interp.sweep.cell.safe_run_cell``), any other work stops at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

__all__ = ["WORKER", "stop_workers", "worker_init"]

WORKER: dict[str, Any] = {"in_worker": False}  # True in a worker process


def worker_init(parent: int) -> None:
    """A local worker process: Ctrl-C (sent to the whole process group) is left to the parent,
    which stops the workers with SIGTERM; a worker whose parent dies (even by SIGKILL) gets
    SIGTERM too (Linux), so that no orphan goes on writing a cell."""
    WORKER["in_worker"] = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(
                1, int(signal.SIGTERM)
            )  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def stop_workers(pool: Any, wait_s: float = 120.0) -> None:
    """SIGTERM every worker (a training cell saves a checkpoint and returns; any other stops at
    once), wait for them, and SIGKILL what is left."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join()

"""A sweep's progress: one line per finished cell with an ETA, and a heartbeat while none finishes."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

__all__ = ["Progress"]


def _dur(seconds: float, digits: int = 1) -> str:  # seconds while short, minutes after
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.{digits}f} min"


class Progress:
    """Overall progress of a sweep, one line per finished cell: cells done of total, the
    outcome, the wall time per cell, and an ETA for the rest; and, while no cell finishes, a
    line every ``heartbeat`` seconds, so that a long first round is not silent.

    The cells run in rounds of ``workers`` that start together, so the time per cell is the
    elapsed time over the rounds begun so far (the first cell to finish says how long its whole
    round takes, not a third of it), and the ETA is the time the last round ends at that rate."""

    def __init__(
        self,
        total: int,
        workers: int,
        enabled: bool,
        clock=time.time,
        stream=None,
        heartbeat: float = 120.0,
    ):
        self.total, self.workers, self.enabled = total, max(1, min(workers, total or 1)), enabled
        self.clock, self.stream, self.done, self.heartbeat = clock, stream, 0, heartbeat
        self.t0 = self.last = clock()

    def estimate(self) -> tuple[float, float, float]:
        """(elapsed, seconds per cell, ETA in seconds)."""
        elapsed = self.clock() - self.t0
        rounds = math.ceil(self.done / self.workers)
        per_cell = elapsed / rounds
        eta = max(0.0, math.ceil(self.total / self.workers) * per_cell - elapsed)
        return elapsed, per_cell, eta

    def line(self, outcome: dict[str, Any]) -> str:
        elapsed, per_cell, eta = self.estimate()
        acc = outcome.get("final", {}).get("test_acc")
        status = (
            "FAILED: " + str(outcome["error"])[:80]
            if "error" in outcome
            else (f"held-out acc {acc:.3f}" if isinstance(acc, float) else "done")
        )
        left = (
            ""
            if self.done == self.total
            else (
                f"ETA {_dur(eta, 0)}"
                if eta >= 1
                else "ETA soon (the cells still running started with this one)"
            )
        )
        return (
            f"[{self.done}/{self.total}] {outcome.get('id', '?')}: {status}; "
            f"{_dur(elapsed)} elapsed, {_dur(per_cell)}/cell" + (f", {left}" if left else "")
        )

    def update(self, outcome: dict[str, Any]) -> None:
        self.done += 1
        self.last = self.clock()
        if self.enabled:
            print(self.line(outcome), file=self.stream or sys.stderr, flush=True)

    def tick(self) -> None:
        """A line saying the sweep is alive, at most every ``heartbeat`` seconds."""
        now = self.clock()
        if not self.enabled or now - self.last < self.heartbeat or self.done >= self.total:
            return
        self.last = now
        running = min(self.workers, self.total - self.done)
        est = (
            ""
            if not self.done
            else f", {_dur(self.estimate()[1])}/cell, ETA {_dur(self.estimate()[2], 0)}"
        )
        print(
            f"[{self.done}/{self.total}] {running} cell(s) running; {_dur(now - self.t0)} elapsed{est}",
            file=self.stream or sys.stderr,
            flush=True,
        )

"""The head whose route ``pe-interp circuit`` studies: the single-head deposit of the run's
``ablation.json``, else its layer-concentration head, else the head whose ablation hurts most;
without that file, the largest exact drop among the heads that a sampled sweep ranks first. And
the route into it (:func:`read_route`), and the command's phase lines (:class:`Phases`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

__all__ = ["Phases", "read_route", "top_head"]


class Phases:
    """Each phase's line on stderr as it starts, and the seconds the one before took."""

    def __init__(self, enabled: bool):
        self.enabled, self.t0, self.last = enabled, time.perf_counter(), None

    def __call__(self, text: str | None) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.last is not None:
            print(f"  {self.last}: {now - self.t0:.0f} s", file=sys.stderr, flush=True)
        if text is not None:
            print(f"{text} ...", file=sys.stderr, flush=True)
        self.t0, self.last = now, text


def read_route(model, task, head: tuple[int, int], fams, say: Phases, **how):
    """The exact route into ``head`` (:func:`probes.circuits.route.head_route` on ``how``'s
    ``n``, ``seed`` and ``metric``, with ``fams``' estimates)."""
    from probes.circuits.route import head_route

    say(f"the route into L{head[0]}H{head[1]}: exact path patching")
    attributions = {k: fams[k] for k in ("position", "content")}
    return head_route(model, task, head, attributions=attributions, progress=say.enabled, **how)


def top_head(run, n: int = 1000, say: Phases | None = None) -> tuple[tuple[int, int], str]:
    """The single-head deposit, the layer-concentration head or the top head, and where it comes
    from; ``say``: the sampled sweep's phase line and bar (the file's heads need none)."""
    import numpy as np

    from pe_interp.runs.checkpoint import STALE, weights_status
    from probes import AblationResult, ablate_heads, dominance, find_deposits
    from probes.ablation import Sampled

    path = Path(run.result_dir) / "ablation.json"
    if path.is_file():
        status, why = weights_status(run.run_dir, path, run.at_step)
        if status == STALE:  # its top head would be another model's
            raise ValueError(
                f"{path}: {why}; rerun `pe-interp ablate {run.name}` (or remove the file) first"
            )
        result = AblationResult.load(path)
        d = dominance(result)
        if d.single:
            return (d.layer, d.head), "single-head deposit (ablation.json)"
        report = find_deposits(result)
        if report.first is not None:
            return report.first, "layer concentration, no single-head deposit (ablation.json)"
        layer, head = np.unravel_index(np.nanargmax(result.drops), result.drops.shape)
        return (
            int(layer),
            int(head),
        ), "largest ablation drop; no single-head deposit or layer concentration (ablation.json)"
    # Without the full grid, no verdict (it needs every head's drop on every example): the head whose
    # exact ablation hurts most among the three that the grid on a fifth of the examples ranks first.
    if say is not None:
        say("the head whose route is read: sampled head ablation")
    test = run.test_set(n)
    result = ablate_heads(
        run.model,
        test.tokens,
        test.labels,
        pad_mask=test.pad_mask,
        engine=Sampled(share=0.2, verify_top=3),
        n_bootstrap=0,
        progress=say is not None and say.enabled,
    )
    layer, head = np.unravel_index(np.nanargmax(result.drops), result.drops.shape)
    return (
        (int(layer), int(head)),
        "largest exact drop of the 3 heads a fifth of the examples ranks first (no ablation.json, no verdict)",
    )

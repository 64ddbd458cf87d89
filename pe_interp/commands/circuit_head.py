"""The head whose route ``pe-interp circuit`` studies: the single-head deposit of the run's
``ablation.json``, else its layer-concentration head, else the head whose ablation hurts most;
without that file, the largest exact drop among the heads that a sampled sweep ranks first.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["top_head"]


def top_head(run, n: int = 1000, progress: bool = False) -> tuple[tuple[int, int], str]:
    """The single-head deposit, the layer-concentration head or the top head, and where it comes from."""
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
    test = run.test_set(n)
    result = ablate_heads(
        run.model,
        test.tokens,
        test.labels,
        pad_mask=test.pad_mask,
        engine=Sampled(share=0.2, verify_top=3),
        n_bootstrap=0,
        progress=progress,
    )
    layer, head = np.unravel_index(np.nanargmax(result.drops), result.drops.shape)
    return (
        (int(layer), int(head)),
        "largest exact drop of the 3 heads a fifth of the examples ranks first (no ablation.json, no verdict)",
    )

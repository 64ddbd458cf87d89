"""Benchmark: exact edge ablation's writer differences in one buffer (a reader layer's prefix is a
view) against the concatenation per reader layer it replaced, on SmolLM2-135M (issue 55, item 5).

One process, one ``EdgeEvaluator`` (σ-free corrupt ablation, metric margin) on ``--n`` position
pairs of the induction prompts (seed 1), ``--masks`` random keep masks (30% of the units kept,
seed 0); the two sides alternate ``--repeats`` times and the medians are compared. The metrics of
the two must be equal exactly (the same sums, read from a view instead of a copy). Skips with one
line where SmolLM2 is not installed (``make smollm2``, or ``--model``).

    python benchmarks/edge_buffer.py [--n 8] [--masks 2] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

DEFAULT_MODEL = (
    Path(__file__).resolve().parents[1] / ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--masks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not Path(args.model).is_file():
        print(f"skipped: {args.model} not found (make smollm2)")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch

    import pe_interp
    from pe_interp.util.hardware import cpu_has_bf16
    from probes.circuits import edge_ablation
    from probes.circuits.evaluator import EdgeEvaluator

    torch.set_num_threads(args.threads)
    model = pe_interp.load(args.model, task="induction")
    pairs = model.origin.task.counterfactuals(args.n, kind="position", seed=1)
    ev = EdgeEvaluator(
        model, pairs, None, ablation="corrupt", metric="margin", reference=None, seed=0,
        batch_size=None, spans=None, n_spans=1,
    )  # fmt: skip
    units = ev.units()
    rng = np.random.default_rng(0)
    keeps = np.stack([units & (rng.random(units.shape) < 0.3) for _ in range(args.masks)])
    edits = edge_ablation._ReaderEdits
    buffered = edits.__init__

    def concatenated(self, *a, **k):  # the code before: every prefix a fresh concatenation
        buffered(self, *a, **k)
        self.buffered = False

    times: dict[str, list[float]] = {"concatenated": [], "buffer": []}
    out = {}
    for _ in range(args.repeats):
        for side, init in (("concatenated", concatenated), ("buffer", buffered)):
            edits.__init__ = init
            t0 = time.perf_counter()
            out[side] = ev(keeps)
            times[side].append(time.perf_counter() - t0)
    edits.__init__ = buffered
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = float(np.abs(out["concatenated"] - out["buffer"]).max())
    print(
        f"SmolLM2, {args.n} pairs x {args.masks} keep masks, {args.threads} thread(s), "
        f"cpu_has_bf16={cpu_has_bf16()}, load {os.getloadavg()[0]:.1f}: "
        f"concatenated {med['concatenated']:.1f} s, buffer {med['buffer']:.1f} s (medians of "
        f"{args.repeats}), {med['concatenated'] / med['buffer']:.2f}x; largest metric difference {diff:.1e}"
    )
    return 0 if diff == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: exact single-head zero ablation on a TransformerLens 4 bridge, batched
(``probes.ablate_heads`` on :class:`pe_interp.models.bridge.model.BridgedModel`: stacked copies, one forward
per many ablations) against the naive loop (one bridge forward per head and batch, a hook
zeroing that head's ``hook_z``: ``probes.ablate_heads_naive`` on the same bridge).

Each architecture is built at the ``mid`` shape (6 layers x 16 heads, d_model 128, d_mlp 256)
from its config with random weights, saved and booted offline; the examples are task 1's
(``DistanceTask`` at ``mid``), in language-model form (class c is the answer token 128 + c).
Prints, per architecture, the median of ``--repeats`` timings of each side, their ratio (goal
>= 3) and the largest difference between the two sweeps' per-example true-answer logits.

    python benchmarks/bridge_ablation.py [--arch gpt2 llama] [--n 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pe_interp.config.presets import PRESETS  # noqa: E402
from pe_interp.models.bridge.hf_arch import (  # noqa: E402
    ARCHS,
    boot_bridge,
    build_hf_model,
    save_model_dir,
    word_tokenizer,
)
from pe_interp.models.bridge.model import BridgedModel  # noqa: E402
from pe_interp.tasks import DistanceTask  # noqa: E402
from pe_interp.tasks.batch import PAD_ID  # noqa: E402
from pe_interp.util.hardware import cpu_has_bf16  # noqa: E402
from probes import ablate_heads, ablate_heads_naive  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=list(ARCHS), choices=ARCHS)
    ap.add_argument("--n", type=int, default=256, help="held-out examples")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    mid = PRESETS["mid"]
    task = DistanceTask(**mid.task["distance"], seed=0)
    batch = task.sample(args.n, seed=1)
    d_task, n_classes = mid.task["distance"]["d_vocab"], task.n_classes
    shape = dict(
        n_layers=mid.model["n_layers"],
        d_model=mid.model["d_model"],
        n_heads=mid.model["n_heads"],
        d_mlp=mid.model["d_mlp"],
        n_ctx=batch.tokens.shape[1],
        d_vocab=d_task + n_classes,
        pad_id=PAD_ID,
    )
    print(
        f"CPU: {torch.get_num_threads()} threads, avx512_bf16 {cpu_has_bf16()}; float32; {args.n} examples of task 1 "
        f"(width {batch.tokens.shape[1]}), {shape['n_layers']} x {shape['n_heads']} heads"
    )
    for arch in args.arch:
        with tempfile.TemporaryDirectory() as tmp:
            out = save_model_dir(
                build_hf_model(arch, seed=0, **shape), word_tokenizer(shape["d_vocab"], PAD_ID), tmp
            )
            model = BridgedModel(boot_bridge(out), answers=range(d_task, d_task + n_classes))
        kw = dict(pad_mask=batch.pad_mask, metric="logit", n_bootstrap=0, per_example=True)
        times: dict[str, list[float]] = {"batched": [], "naive": []}
        results = {}
        for _ in range(args.repeats):
            for name, fn in (("batched", ablate_heads), ("naive", ablate_heads_naive)):
                t0 = time.perf_counter()
                results[name] = fn(model, batch.tokens, batch.labels, **kw)
                times[name].append(time.perf_counter() - t0)
        fast, slow = statistics.median(times["batched"]), statistics.median(times["naive"])
        diff = float(
            np.nanmax(np.abs(results["batched"].per_example - results["naive"].per_example))
        )
        print(
            f"{arch:<9} batched {fast:7.2f} s   naive {slow:7.2f} s   ratio {slow / fast:5.2f}x (goal >= 3)   "
            f"largest per-example logit difference {diff:.1e}"
        )


if __name__ == "__main__":
    main()

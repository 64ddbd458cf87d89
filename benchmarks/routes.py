"""What route shares (the positional criterion's measure) cost, against baselines measured in the
same run, medians of ``--repeats``:

- ``route_shares`` (each head's route a replacement of its output in the exact ablation sweep,
  :mod:`probes.routes.moving`);
- the naive per-route loop it replaced: one forward per route and chunk of pairs, from the
  embedding, with that route's positions moved (:func:`probes.routes.moving.move_hooks`); the
  shares of both are compared (they must agree to float rounding);
- the exact single-head ablation grid on as many examples (:func:`probes.ablate_heads`), the
  other half of a dynamics snapshot's probing.

    python benchmarks/routes.py [--run RUN_DIR[@STEP]] [--n 128] [--repeats 3]

Without ``--run``, a model at the ``mid`` shape with random weights (scaled so that position
matters) on task 1.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import pe_interp
from pe_interp.config.presets import build_run_configs
from pe_interp.util.hardware import cpu_has_bf16
from probes import ablate_heads, route_shares
from probes.common.inputs import position_permutation
from probes.patching.sweep import logit_diff
from probes.routes.moving import move_hooks, position_routes


@torch.no_grad()
def naive_shares(model, pairs, batch_size: int = 128) -> np.ndarray:
    """Each head route's share, one forward per route and chunk (the reference)."""
    clean, corrupt, mask = pairs.clean.tokens, pairs.corrupt.tokens, pairs.clean.pad_mask
    good, bad = pairs.clean.labels, pairs.corrupt.labels
    sigma = position_permutation(clean, corrupt)
    extra, routes = position_routes(model)
    n = len(clean)
    units = [(int(a), int(h)) for a, h in zip(*np.nonzero(routes))] + ["all"]
    ld = torch.empty(len(units) + 1, n, dtype=torch.float64)
    model.eval()
    for r0 in range(0, n, batch_size):
        rows = slice(r0, min(n, r0 + batch_size))
        k = rows.stop - rows.start
        ld[-1, rows] = logit_diff(model(clean[rows], mask[rows]), good[rows], bad[rows]).double()
        for i, u in enumerate(units):
            heads = torch.zeros(k, *routes.shape, dtype=torch.bool)
            if u == "all":
                heads[:] = torch.as_tensor(routes)
            else:
                heads[:, u[0], u[1]] = True
            embed = torch.full((k,), u == "all" and bool(extra))
            with model.hooks(fwd_hooks=move_hooks(model, sigma[rows], heads, embed, 0)):
                ld[i, rows] = logit_diff(
                    model(clean[rows], mask[rows]), good[rows], bad[rows]
                ).double()
    base, every = ld[-1], ld[-2]
    shares = np.zeros(routes.shape)
    for i, u in enumerate(units[:-1]):
        shares[u] = float((base - ld[i]).mean() / (base - every).mean())
    return shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--run", help="a run directory (RUN@STEP for a snapshot); default: a random mid model"
    )
    ap.add_argument("--n", type=int, default=128, help="pairs (and ablation examples)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.run:
        path, _, step = args.run.partition("@")
        run = pe_interp.load_run(path, step=int(step) if step else None)
        model, task, seed = run.model, run.task, run.train_cfg.seed
    else:
        model_cfg, task, _ = build_run_configs("distance", "rope", "mid", seed=0)
        model = pe_interp.HookedPETransformer(model_cfg)
        with torch.no_grad():
            for blk in model.blocks:
                blk.attn.W_Q.mul_(4.0)
                blk.attn.W_K.mul_(4.0)
        seed = 0
    pairs = task.counterfactuals(args.n, kind="position", seed=seed + 7_717)
    test = task.sample(args.n, seed=seed + 1)
    args_ = (
        model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
    )
    print(
        f"CPU native bf16: {cpu_has_bf16()} (float32 here), {torch.get_num_threads()} threads; "
        f"{model.cfg.n_layers} layers x {model.cfg.n_heads} heads, {args.n} pairs / examples"
    )
    times: dict[str, list[float]] = {"route_shares": [], "naive": [], "ablation": []}
    for _ in range(args.repeats):  # interleaved, so that load changes hit each alike
        t = time.perf_counter()
        fast = route_shares(*args_, pad_mask=pairs.clean.pad_mask, n_bootstrap=0)
        times["route_shares"].append(time.perf_counter() - t)
        t = time.perf_counter()
        ref = naive_shares(model, pairs)
        times["naive"].append(time.perf_counter() - t)
        t = time.perf_counter()
        ablate_heads(model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=0)
        times["ablation"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    err = float(np.abs(fast.shares - ref).max())
    print(f"max |share - naive share| = {err:.1e} (positional effect {fast.effect:.3g} logits)")
    print(
        f"route_shares {med['route_shares']:.2f} s, naive per-route loop {med['naive']:.2f} s: "
        f"{med['naive'] / med['route_shares']:.2f}x faster; the ablation grid {med['ablation']:.2f} s "
        f"(route_shares / ablation = {med['route_shares'] / med['ablation']:.2f})"
    )


if __name__ == "__main__":
    main()

"""How well attribution ranks like the exact interventions, on trained models.

For each run directory (``pe_interp.train(..., out=...)``), with the metric ``margin`` (the clean
label's logit minus the largest other) everywhere so that estimates and exact effects share units:

- **heads vs exact ablation**: zero-ablation estimates of every head (``atp``, ``atp*``) against
  ``ablate_heads(metric=margin)`` and against the accuracy drops;
- **heads vs exact patching**: node estimates on position counterfactuals (``atp``, ``atp*``,
  ``eap-ig``) against ``probes.patch(site="z")`` (clean into corrupt);
- **edges vs exact path patching**: every edge's estimate against ``probes.exact_edges`` under the
  position and the content family.

Prints Spearman's rho (signed, and ranking against |exact|) and top-k agreement, and writes JSON.

    python benchmarks/circuit_agreement.py runs/circuits-quick/* --out runs/circuits-quick/agreement.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pe_interp import load_run
from probes import ablate_heads, attribute, patch
from probes.circuits import exact_edges
from probes.circuits.agreement import agreement
from probes.circuits.engine import METRICS

MARGIN = METRICS["margin"]


def heads(a) -> np.ndarray:
    return a.head_scores()


def evaluate(run_dir: str, n: int, n_ablation: int, methods: list[str]) -> dict:
    run = load_run(run_dir)
    model, task = run.model, run.task
    out: dict = {"run": run_dir, "encoding": model.cfg.encoding_name}
    test = run.test_set(n_ablation)

    def margin(logits, labels):
        return MARGIN(logits, labels, labels)

    exact_m = ablate_heads(
        model, test.tokens, test.labels, pad_mask=test.pad_mask, metric=margin, n_bootstrap=0
    ).drops
    acc = ablate_heads(model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=0)
    exact_acc, out["test_acc"] = acc.drops, acc.baseline
    out["ablation"] = {}
    for m in [x for x in methods if x != "eap-ig"]:
        est = attribute(model, test, metric="margin", method=m)
        rank = np.abs(heads(est)) if m == "atp" else _head_magnitude(est)
        out["ablation"][m] = {
            "vs_margin": agreement(heads(est), exact_m, 3, rank),
            "vs_accuracy": agreement(heads(est), exact_acc, 3, rank),
            "top_head_same": bool(np.nanargmax(rank) == np.nanargmax(exact_acc)),
        }
    pairs = task.counterfactuals(n, kind="position", seed=0)
    labels = pairs.clean.labels
    pz = patch(
        model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        site="z",
        pad_mask=pairs.clean.pad_mask,
        metric=lambda logits: MARGIN(logits, labels, labels),
        n_bootstrap=0,
    )
    exact_z = pz.values.double().numpy() - pz.corrupt_value
    out["patching"] = {}
    for m in methods:
        est = attribute(model, pairs, metric="margin", method=m, steps=8)
        out["patching"][m] = agreement(
            heads(est), exact_z, 3, None if m != "atp*" else _head_magnitude(est)
        )
    out["edges"] = {}
    for kind in ("position", "content"):
        fam = task.counterfactuals(n, kind=kind, seed=0)
        t0 = time.perf_counter()
        ex = exact_edges(model, fam, metric="margin")
        out["edges"].setdefault(kind, {})["exact_seconds"] = time.perf_counter() - t0
        for m in methods:
            t0 = time.perf_counter()
            est = attribute(model, fam, metric="margin", method=m, granularity="edge", steps=8)
            res = agreement(est.scores, ex.scores, 10, est.ranking)
            if est.magnitude is not None:  # atp*: the ranking by |signed score| (no GradDrop) too
                res["top_k_signed"] = agreement(est.scores, ex.scores, 10)["top_k"]
            res["seconds"] = time.perf_counter() - t0
            out["edges"][kind][m] = res
    return out


def _head_magnitude(a) -> np.ndarray:
    mags = dict(zip(a.writers, a.magnitude.tolist()))
    return np.array(
        [[mags[f"L{layer}H{h}"] for h in range(a.n_heads)] for layer in range(a.n_layers)]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--n", type=int, default=128, help="counterfactual pairs per family")
    p.add_argument(
        "--n-ablation", type=int, default=500, help="held-out examples for head ablation"
    )
    p.add_argument("--methods", nargs="+", default=["atp", "atp*", "eap-ig"])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for r in args.runs:
        if not (Path(r) / "config.json").is_file():
            continue
        t0 = time.perf_counter()
        res = evaluate(r, args.n, args.n_ablation, args.methods)
        res["seconds"] = time.perf_counter() - t0
        results.append(res)
        print(f"\n{res['encoding']} ({r}, {res['seconds']:.0f} s)")
        for m, v in res["ablation"].items():
            a, b = v["vs_margin"], v["vs_accuracy"]
            print(
                f"  heads vs zero ablation  {m:7s} rho {a['spearman']:+.2f} |rho| {a['spearman_abs']:+.2f} "
                f"top-3 {a['top_k']:.2f}; vs accuracy drop top-3 {b['top_k']:.2f}, same top head {v['top_head_same']}"
            )
        for m, a in res["patching"].items():
            print(
                f"  heads vs z patching     {m:7s} rho {a['spearman']:+.2f} |rho| {a['spearman_abs']:+.2f} top-3 {a['top_k']:.2f}"
            )
        for kind, d in res["edges"].items():
            for m, a in d.items():
                if m != "exact_seconds":
                    print(
                        f"  edges vs path patching {kind:8s} {m:7s} rho {a['spearman']:+.2f} |rho| {a['spearman_abs']:+.2f} "
                        f"top-10 {a['top_k']:.2f} ({a['seconds']:.1f} s; exact {d['exact_seconds']:.1f} s)"
                    )
        sys.stdout.flush()
        if args.out:
            from pe_interp.util.io import atomic_write_json

            atomic_write_json(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

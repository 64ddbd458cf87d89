"""Benchmark: edge screens against exact edge ablation (issue 55, item 4, "The screen").

For each run directory, on ``--n`` counterfactual pairs of one family (``--family``, seed 0;
margin metric; the corrupt run's values replace what a circuit drops), every edge (whole edges,
positions summed) is scored by three screens of :func:`probes.circuits.attribute`:

- ``atp``: attribution patching, the gradient at the corrupt run (``direction="denoise"``);
- ``eap-ig``: EAP-IG with ``--steps`` (5) embeddings between corrupt and clean;
- ``clean-corrupt``: the gradient averaged over the clean and the corrupt run (the mean of the
  ``"denoise"`` and ``"noise"`` AtP estimates, which share the edge's delta: the trapezoid rule
  of the same integral, two endpoints);
- ``hvp, P probes`` (``--hvp``, default 1 and 4; 0 for one edge a probe, the exact diagonal): AtP
  at the corrupt run plus each edge's second-order term from Hessian-vector products
  (``method="hvp"``), with the edges it flags (second-order term above the first) counted, and
  among the exact top ``--top`` edges that AtP signs wrong, how many it flags and signs right;

and by the exact reference, each edge patched alone (:func:`probes.circuits.exact_edges`, path
patching, clean into corrupt). Per screen: its time; Spearman's rho with the exact effects over
every edge; the recall of the exact top ``--top`` edges (by |effect|) among its own top ``--top``;
the sign agreement on them; and its faithfulness curve: the share of the clean-corrupt metric gap
recovered by its top-n edges by |score| (``select="top"``, not connected) with every other edge
ablated exactly (:func:`probes.circuits.faithfulness_curve`), on ``--n`` held-out pairs (seed 1),
at shares of the graph (``--shares``), with the curve's area.

    python benchmarks/edge_screens.py checkpoints/planted-one-route [--n 64] [--family position]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def screens(
    model, pairs, steps: int, hvp: list[int], exact: bool = True
) -> dict[str, tuple[object, float]]:
    """Every edge scored by each screen (and, with ``exact``, the exact reference), with its time
    in seconds."""
    from probes.circuits import attribute, exact_edges

    kw = dict(granularity="edge", metric="margin")
    out = {}
    t0 = time.perf_counter()
    atp = attribute(model, pairs, method="atp", **kw)
    out["atp"] = atp, time.perf_counter() - t0
    t0 = time.perf_counter()
    out[f"eap-ig, {steps} steps"] = (
        attribute(model, pairs, method="eap-ig", steps=steps, **kw),
        time.perf_counter() - t0,
    )
    t0 = time.perf_counter()
    noise = attribute(model, pairs, method="atp", direction="noise", **kw)
    both = dataclasses.replace(atp, scores=(atp.scores + noise.scores) / 2, mode="clean-corrupt")
    out["clean-corrupt"] = both, out["atp"][1] + time.perf_counter() - t0
    for p in hvp:
        t0 = time.perf_counter()
        probes = p or int(np.isfinite(atp.scores).sum())  # 0: one edge a probe
        est = attribute(model, pairs, method="hvp", steps=probes, **kw)
        out[f"hvp, {probes} probes"] = est, time.perf_counter() - t0
    if exact:
        t0 = time.perf_counter()
        out["exact (path patching)"] = (
            exact_edges(model, pairs, metric="margin"),
            time.perf_counter() - t0,
        )
    return out


def agreement(est: np.ndarray, exact: np.ndarray, top: int) -> tuple[float, float, float]:
    """Spearman's rho over every edge; recall of the exact top ``top`` (by |effect|) among the
    screen's top ``top`` (by |score|); the share of those exact top edges it signs right."""
    from probes.circuits.agreement import spearman

    ok = ~np.isnan(exact)
    e, x = est[ok], exact[ok]
    want = np.argsort(-np.abs(x), kind="stable")[:top]
    got = np.argsort(-np.abs(e), kind="stable")[:top]
    recall = len(set(want) & set(got)) / top
    return spearman(e, x), recall, float(np.mean(np.sign(e[want]) == np.sign(x[want])))


def flags(est, atp: np.ndarray, exact: np.ndarray, top: int) -> str:
    """An hvp screen's flags: how many edges, and among the exact top ``top`` edges that AtP signs
    wrong, how many it flags and how many its corrected score signs right."""
    exact = exact.reshape(-1)
    ok = ~np.isnan(exact)
    flagged = np.asarray(est.meta["flagged"], dtype=bool).reshape(-1)[ok]
    e, x, a = est.scores.reshape(-1)[ok], exact[ok], atp.reshape(-1)[ok]
    want = np.argsort(-np.abs(x), kind="stable")[:top]
    wrong = want[np.sign(a[want]) != np.sign(x[want])]
    fixed = int((np.sign(e[wrong]) == np.sign(x[wrong])).sum())
    return (
        f"{int(flagged.sum())} of {int(ok.sum())} edges flagged; of the exact top {top}, AtP signs "
        f"{len(wrong)} wrong, {int(flagged[wrong].sum())} of them flagged, {fixed} signed right "
        f"after the correction"
    )


def evaluate(run_dir: str, args) -> None:
    from pe_interp import load_run
    from probes.circuits import faithfulness_curve

    run = load_run(run_dir)
    model, task = run.model.eval(), run.task
    sel = task.counterfactuals(args.n, kind=args.family, seed=0)
    held = task.counterfactuals(args.n, kind=args.family, seed=1)
    scored = screens(model, sel, args.steps, args.hvp)
    exact = scored["exact (path patching)"][0].scores
    total = int((~np.isnan(exact)).sum())
    sizes = sorted({int(round(x * total)) for x in [0.0, *args.shares, 1.0]})
    gap = scored["atp"][0]
    print(
        f"\n{model.cfg.encoding_name} {task.name} ({run_dir}): {total} edges; {args.family} pairs, "
        f"{args.n} to score (seed 0; margin clean {gap.clean_metric:+.3f}, corrupt "
        f"{gap.corrupt_metric:+.3f}), {args.n} held out (seed 1)"
    )
    print(
        f"| screen | time | rho with exact | recall of exact top {args.top} | signs right | "
        f"area | faithfulness at {', '.join(f'{s} ({s / total:.0%})' for s in sizes[1:-1])} edges |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (a, t) in scored.items():
        rho, recall, signs = agreement(a.scores, exact, args.top)
        curve = faithfulness_curve(model, a, held, sizes=sizes, select="top")
        pts = " ".join(f"{r:.2f}" for r in curve["recovered"][1:-1])
        print(
            f"| {name} | {t:.1f} s | {rho:.2f} | {recall:.2f} | {signs:.2f} | {curve['area']:.3f} | {pts} |",
            flush=True,
        )
    for name, (a, _) in scored.items():
        if "flagged" in a.meta:
            print(f"  {name}: {flags(a, scored['atp'][0].scores, exact, args.top)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--family", default="position", choices=["position", "content", "both"])
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG's steps")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument(
        "--hvp", type=int, nargs="*", default=[1, 4], help="hvp probes (0: one edge a probe)"
    )
    ap.add_argument(
        "--shares", type=float, nargs="+", default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5]
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from smollm2 import cpu_name

    from pe_interp.util.hardware import cpu_has_bf16

    print(
        f"{cpu_name()}, {torch.get_num_threads()} threads, avx512_bf16 {cpu_has_bf16()}, "
        f"load {os.getloadavg()[0]:.1f}; float32"
    )
    for r in args.runs:
        evaluate(r, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

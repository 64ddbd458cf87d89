"""How well ``ablate_heads(engine="attribution")`` ranks heads like exact zero ablation, on trained
runs, and which way of estimating agrees best.

For each run directory: the exact grid (zero ablation, accuracy, held-out examples; read from
``RUN_DIR/ablation.json`` when it holds that grid, as the sweep writes it) against

- ``atp-logprob``: the old engine (attribution patching at the clean point, the true class's
  log-probability);
- ``{path}-{surrogate}-K``: :func:`probes.circuits.heads.rank_heads`, integrated along the
  ``joint`` or ``layer`` ablation path with ``K`` Gauss-Legendre nodes, surrogate ``accuracy``
  (margin flips), ``margin`` or ``logprob``.

Prints, per run and estimator, Spearman's rho against the exact accuracy drops, whether the
estimate's top head is the exact top head, the rank the estimate gives the exact top head, and
whether the engine (the exact drops of the estimate's ``--verify-top`` heads) finds it; then a
summary over runs. One thread; times are of the estimate alone.

    python benchmarks/head_ranking.py /tmp/runs/q-* --n 1000 --out head_ranking.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pe_interp import load_run
from pe_interp.io import atomic_write_json
from pe_interp.tasks.batch import Batch
from probes import ablate_heads, attribute
from probes.ablation import AblationResult
from probes.circuits.agreement import spearman
from probes.circuits.heads import rank_heads

DEFAULT = ["atp-logprob", "joint-accuracy-2", "joint-accuracy-4", "joint-accuracy-8", "joint-margin-4",
           "joint-logprob-4", "layer-accuracy-2"]  # fmt: skip


def exact_grid(run, n: int) -> tuple[AblationResult, Batch, float]:
    """The exact zero-ablation accuracy grid on the held-out set, and its seconds (0 when read)."""
    path = Path(run.run_dir) / "ablation.json"
    if path.is_file():
        res = AblationResult.load(path)
        if (res.method, res.metric, res.meta.get("eval_set", "test")) == ("zero", "accuracy", "test") and not np.isnan(res.drops).any():
            return res, run.test_set(res.n_examples), 0.0
    test = run.test_set(n)
    t0 = time.perf_counter()
    res = ablate_heads(run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=0)
    return res, test, time.perf_counter() - t0


def estimate(model, test: Batch, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The estimate and what breaks its ties (the engine's order)."""
    if name == "atp-logprob":
        est = attribute(model, test, metric="logprob", direction="noise").head_scores()
        return est, est
    path, surrogate, k = name.split("-")
    r = rank_heads(model, test.tokens, test.labels, test.pad_mask.to(test.tokens.device), surrogate=surrogate,
                   steps=int(k), path=path)  # fmt: skip
    return r["estimate"], r["tiebreak"]


def evaluate(run_dir: str, n: int, names: list[str], verify_top: int) -> dict:
    run = load_run(run_dir)
    model = run.model.eval()
    exact, test, t_exact = exact_grid(run, n)
    ex = exact.drops
    top = np.unravel_index(np.nanargmax(ex), ex.shape)
    out = {"run": run_dir, "encoding": model.cfg.encoding_name, "accuracy": exact.baseline, "n": exact.n_examples,
           "exact_seconds": t_exact, "exact_top": [int(top[0]), int(top[1])], "exact_top_drop": float(ex[top]),
           "estimators": {}}  # fmt: skip
    for name in names:
        t0 = time.perf_counter()
        est, tie = estimate(model, test, name)
        seconds = time.perf_counter() - t0
        order = np.lexsort((-tie.ravel(), -est.ravel()))
        verified = order[:verify_top]
        found = np.unravel_index(verified[np.argmax(ex.ravel()[verified])], ex.shape)
        out["estimators"][name] = {
            "spearman": spearman(est, ex), "top_same": bool(order[0] == np.ravel_multi_index(top, ex.shape)),
            "rank_of_exact_top": int(np.flatnonzero(order == np.ravel_multi_index(top, ex.shape))[0]) + 1,
            "engine_top_same": bool(found == top), "seconds": seconds, "estimate": est.tolist(),
        }  # fmt: skip
    out["exact"] = ex.tolist()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--n", type=int, default=1000, help="held-out examples (when the run has no ablation.json)")
    p.add_argument("--estimators", nargs="+", default=DEFAULT)
    p.add_argument("--verify-top", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for r in args.runs:
        if not (Path(r) / "config.json").is_file() or not (Path(r) / "model.safetensors").is_file():
            continue
        res = evaluate(r, args.n, args.estimators, args.verify_top)
        results.append(res)
        print(f"\n{res['encoding']} ({r}): accuracy {res['accuracy']:.3f} on {res['n']}, exact top L{res['exact_top'][0]}H"
              f"{res['exact_top'][1]} drop {res['exact_top_drop']:.3f} ({res['exact_seconds']:.1f} s)")
        for name, e in res["estimators"].items():
            print(f"  {name:18s} rho {e['spearman']:+.3f}  top same {str(e['top_same']):5s}  exact top ranked "
                  f"{e['rank_of_exact_top']:>2}  engine (verify {args.verify_top}) finds it {str(e['engine_top_same']):5s}"
                  f"  {e['seconds']:.1f} s")  # fmt: skip
        sys.stdout.flush()
        if args.out:
            atomic_write_json(args.out, results)
    if results:
        print("\nsummary over runs: median rho, runs with rho >= 0.8, top same, engine finds the top")
        for name in args.estimators:
            es = [r["estimators"][name] for r in results]
            rho = [e["spearman"] for e in es]
            print(f"  {name:18s} {np.median(rho):+.3f}  {sum(x >= 0.8 for x in rho)}/{len(es)}  "
                  f"{sum(e['top_same'] for e in es)}/{len(es)}  {sum(e['engine_top_same'] for e in es)}/{len(es)}")
            low = [f"{r['encoding']} {e['spearman']:+.2f}" for r, e in zip(results, es) if not e["spearman"] >= 0.8]
            print(f"    goals: rho >= 0.8 in every run: {'met' if not low else 'NOT met (' + ', '.join(low) + ')'}; "
                  f"same top head in {sum(e['top_same'] for e in es)} of {len(es)} (>= 6 of 7: "
                  f"{'met' if sum(e['top_same'] for e in es) >= 6 / 7 * len(es) else 'NOT met'})")
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

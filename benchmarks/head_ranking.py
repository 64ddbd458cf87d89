"""How well the cheaper engines of ``ablate_heads`` rank heads like exact zero ablation, on trained
runs, and how well the exact grid agrees with itself (the ceiling any estimate can reach).

For each run directory: the exact grid (zero ablation, accuracy, held-out examples; read from
``RUN_DIR/ablation.json`` when it holds that grid, as the sweep writes it) against

- ``atp-logprob``: the old engine (attribution patching at the clean point, the true class's
  log-probability);
- ``{path}-{surrogate}-K``: :func:`probes.ablation.ranking.rank_heads`, integrated along the
  ``joint`` or ``layer`` ablation path with ``K`` Gauss-Legendre nodes, surrogate ``accuracy``
  (margin flips), ``margin`` or ``logprob`` (``ablate_heads(engine="attribution")`` ranks by
  ``joint-accuracy-4``);
- ``sampled-F``: ``ablate_heads(engine=Sampled(share=F))``, the exact grid on a seeded share
  ``F`` of the examples with its ``--verify-top`` heads verified on all of them (its time
  includes the verification).

With ``--ceiling`` the exact grid is recomputed with its per-example outcomes, and the ceiling is
the median over 20 random halvings of Spearman's rho between the grid on one half of the
examples and on the other: how well the exact grid ranks heads like itself on other examples.
From it, the Spearman-Brown reliability of the whole grid, ``R = 2 r / (1 + r)``, and
``sqrt(R)``: about the highest rho with this grid that an estimate of the heads' true drops can
reach (an estimate above it shares this sample's noise).

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
from pe_interp.tasks.batch import Batch
from pe_interp.util.io import atomic_write_json
from probes import ablate_heads, attribute
from probes.ablation import AblationResult, Sampled
from probes.ablation.ranking import rank_heads
from probes.circuits.agreement import spearman

DEFAULT = [
    "atp-logprob",
    "joint-accuracy-4",
    "joint-accuracy-8",
    "layer-accuracy-2",
    "sampled-0.1",
    "sampled-0.2",
    "sampled-0.25",
]


def exact_grid(run, n: int, per_example: bool = False) -> tuple[AblationResult, Batch, float]:
    """The exact zero-ablation accuracy grid on the held-out set, and its seconds (0 when read)."""
    path = Path(run.run_dir) / "ablation.json"
    if path.is_file() and not per_example:
        res = AblationResult.load(path)
        if (res.method, res.metric, res.meta.get("eval_set", "test")) == (
            "zero",
            "accuracy",
            "test",
        ) and not np.isnan(res.drops).any():
            return res, run.test_set(res.n_examples), 0.0
    test = run.test_set(n)
    t0 = time.perf_counter()
    res = ablate_heads(
        run.model,
        test.tokens,
        test.labels,
        pad_mask=test.pad_mask,
        n_bootstrap=0,
        per_example=per_example,
    )
    return res, test, time.perf_counter() - t0


def split_half(res: AblationResult, repeats: int = 20, seed: int = 0) -> float:
    """Median Spearman rho between the exact grid on one random half of the examples and on the other."""
    d = res.baseline_per_example[None, None, :] - res.per_example  # per-example drops [L, H, n]
    rng, n = np.random.default_rng(seed), res.n_examples
    rhos = []
    for _ in range(repeats):
        p = rng.permutation(n)
        rhos.append(spearman(d[..., p[: n // 2]].mean(-1), d[..., p[n // 2 :]].mean(-1)))
    return float(np.median(rhos))


def oracle(split_half: float) -> float:
    """About the highest rho with the whole grid that the heads' true drops reach (Spearman-Brown)."""
    r = max(split_half, 0.0)
    return float(np.sqrt(2 * r / (1 + r)))


def estimate(model, test: Batch, name: str, verify_top: int) -> tuple[np.ndarray, np.ndarray]:
    """The estimate and what breaks its ties (the engine's order)."""
    if name.startswith("sampled-"):
        r = ablate_heads(
            model,
            test.tokens,
            test.labels,
            pad_mask=test.pad_mask,
            engine=Sampled(share=float(name.split("-")[1]), verify_top=verify_top),
            n_bootstrap=0,
        )
        return r.drops, -np.arange(r.drops.size, dtype=float).reshape(r.drops.shape)
    if name == "atp-logprob":
        est = attribute(model, test, metric="logprob", direction="noise").head_scores()
        return est, est
    path, surrogate, k = name.split("-")
    r = rank_heads(
        model,
        test.tokens,
        test.labels,
        test.pad_mask.to(test.tokens.device),
        surrogate=surrogate,
        steps=int(k),
        path=path,
    )
    return r["estimate"], r["tiebreak"]


def evaluate(
    run_dir: str, n: int, names: list[str], verify_top: int, ceiling: bool = False
) -> dict:
    run = load_run(run_dir)
    model = run.model.eval()
    exact, test, t_exact = exact_grid(run, n, per_example=ceiling)
    ex = exact.drops
    top = np.unravel_index(np.nanargmax(ex), ex.shape)
    out = {
        "run": run_dir,
        "encoding": model.cfg.encoding_name,
        "accuracy": exact.baseline,
        "n": exact.n_examples,
        "exact_seconds": t_exact,
        "exact_top": [int(top[0]), int(top[1])],
        "exact_top_drop": float(ex[top]),
        "estimators": {},
        "split_half": split_half(exact) if ceiling else None,
    }
    for name in names:
        t0 = time.perf_counter()
        est, tie = estimate(model, test, name, verify_top)
        seconds = time.perf_counter() - t0
        order = np.lexsort((-tie.ravel(), -est.ravel()))
        verified = order[:verify_top]
        found = np.unravel_index(verified[np.argmax(ex.ravel()[verified])], ex.shape)
        out["estimators"][name] = {
            "spearman": spearman(est, ex),
            "top_same": bool(order[0] == np.ravel_multi_index(top, ex.shape)),
            "rank_of_exact_top": int(
                np.flatnonzero(order == np.ravel_multi_index(top, ex.shape))[0]
            )
            + 1,
            "engine_top_same": bool(found == top),
            "seconds": seconds,
            "estimate": est.tolist(),
        }
    out["exact"] = ex.tolist()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument(
        "--n", type=int, default=1000, help="held-out examples (when the run has no ablation.json)"
    )
    p.add_argument("--estimators", nargs="+", default=DEFAULT)
    p.add_argument("--verify-top", type=int, default=3)
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="recompute the exact grid per example: its split-half rho",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for r in args.runs:
        if not (Path(r) / "config.json").is_file() or not (Path(r) / "model.safetensors").is_file():
            continue
        res = evaluate(r, args.n, args.estimators, args.verify_top, args.ceiling)
        results.append(res)
        print(
            f"\n{res['encoding']} ({r}): accuracy {res['accuracy']:.3f} on {res['n']}, exact top L{res['exact_top'][0]}H"
            f"{res['exact_top'][1]} drop {res['exact_top_drop']:.3f} ({res['exact_seconds']:.1f} s)"
            + (
                ""
                if res["split_half"] is None
                else f"; the exact grid's split-half rho {res['split_half']:+.3f}, "
                f"bound for an estimate of the true drops ~{oracle(res['split_half']):.2f}"
            )
        )
        for name, e in res["estimators"].items():
            print(
                f"  {name:18s} rho {e['spearman']:+.3f}  top same {str(e['top_same']):5s}  exact top ranked "
                f"{e['rank_of_exact_top']:>2}  engine (verify {args.verify_top}) finds it {str(e['engine_top_same']):5s}"
                f"  {e['seconds']:.1f} s"
            )
        sys.stdout.flush()
        if args.out:
            atomic_write_json(args.out, results)
    if results:
        halves = [r["split_half"] for r in results if r["split_half"] is not None]
        if halves:
            print(
                f"\nthe exact grid's own split-half rho: median {np.median(halves):+.3f}, >= 0.8 in "
                f"{sum(h >= 0.8 for h in halves)} of {len(halves)} runs ("
                + ", ".join(
                    f"{r['encoding']} {r['split_half']:+.2f}"
                    for r in results
                    if r["split_half"] is not None
                )
                + ")"
            )
        print(
            "\nsummary over runs: median rho, runs with rho >= 0.8, top same, engine finds the top"
        )
        for name in args.estimators:
            es = [r["estimators"][name] for r in results]
            rho = [e["spearman"] for e in es]
            print(
                f"  {name:18s} {np.median(rho):+.3f}  {sum(x >= 0.8 for x in rho)}/{len(es)}  "
                f"{sum(e['top_same'] for e in es)}/{len(es)}  {sum(e['engine_top_same'] for e in es)}/{len(es)}"
            )
            low = [
                f"{r['encoding']} {e['spearman']:+.2f}"
                for r, e in zip(results, es)
                if not e["spearman"] >= 0.8
            ]
            print(
                f"    goals: rho >= 0.8 in every run: {'met' if not low else 'NOT met (' + ', '.join(low) + ')'}; "
                f"same top head in {sum(e['top_same'] for e in es)} of {len(es)} (>= 6 of 7: "
                f"{'met' if sum(e['top_same'] for e in es) >= 6 / 7 * len(es) else 'NOT met'})"
            )
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: edge screens on SmolLM2-135M against exact edge ablation on a sample of edges
(issue 55, item 4, "The screen"; :mod:`edge_screens` on the small models, whose every edge is
path patched; SmolLM2 has ~70k whole edges, too many for that).

On ``--n`` induction position pairs (seed 0; margin metric) every whole edge is scored by the
screens of :func:`edge_screens.screens` (AtP, EAP-IG with ``--steps``, the clean-corrupt average,
hvp with ``--hvp`` probes). A seeded sample of edges (``--seed``): the union of each screen's top
``--top-each`` by |score|, filled up to ``--sample`` with edges drawn uniformly from the rest; each
sampled edge's exact effect is measured by single-edge ablation
(:class:`probes.circuits.evaluator.EdgeEvaluator`: the edge's reader reads the corrupt run's term
of its writer, everything else clean; effect = clean margin - that margin, the screens' sign).
Per screen on the sample: Spearman's rho with the exact effects (over the whole sample and over its
uniformly drawn part), the recall of the sample's exact top ``--top`` among the screen's top
``--top`` in the sample, the share of that exact top it signs right; for hvp, its flags
(:func:`edge_screens.flags`). Then each screen's faithfulness curve (``select="top"``, every other
edge ablated exactly, corrupt values) on ``--n`` held-out pairs (seed 1) at ``--shares``, with
its area.

    python benchmarks/smollm2_edge_screens.py [--n 16] [--sample 200] [--top-each 30] [--hvp 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from edge_screens import agreement, flags, screens  # noqa: E402
from smollm2 import cpu_name  # noqa: E402

GGUF = Path(__file__).resolve().parents[1] / ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def draw_sample(scored, valid: np.ndarray, top_each: int, size: int, seed: int):
    """Flat indices into ``valid`` ([readers, writers]): each screen's top ``top_each`` by |score|
    (their union), then edges drawn uniformly (``seed``) from the rest up to ``size``. Returns
    (the union, the uniform draw)."""
    edges = np.flatnonzero(valid)
    top: set[int] = set()
    for a, _ in scored.values():
        s = np.abs(np.nan_to_num(a.scores.reshape(-1)[edges]))
        top |= set(edges[np.argsort(-s, kind="stable")[:top_each]].tolist())
    union = np.array(sorted(top), dtype=np.int64)
    rest = np.setdiff1d(edges, union)
    rng = np.random.default_rng(seed)
    drawn = rng.choice(rest, size=max(0, size - len(union)), replace=False)
    return union, np.sort(drawn)


def exact_effects(model, pairs, shape, flat: np.ndarray, per_call: int) -> tuple[np.ndarray, float]:
    """Each edge of ``flat`` (flat indices into ``shape`` [readers, writers]) ablated alone (its
    reader reads the corrupt run's term, everything else clean): clean margin minus that margin,
    means over the pairs; ``per_call`` keep masks a call. Also the clean margin."""
    from probes.circuits.evaluator import EdgeEvaluator

    how = dict(ablation="corrupt", metric="margin", reference=None, seed=0, batch_size=None)
    ev = EdgeEvaluator(model, pairs, None, spans=None, n_spans=1, **how)
    full, _ = ev.ends()
    out = np.empty(len(flat))
    for j0 in range(0, len(flat), per_call):
        part = flat[j0 : j0 + per_call]
        keep = np.ones((len(part), shape[0] * shape[1]), dtype=bool)
        keep[np.arange(len(part)), part] = False
        out[j0 : j0 + len(part)] = full - ev(keep.reshape(len(part), *shape, 1)).mean(1)
    return out, full


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default=str(GGUF))
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG's steps")
    ap.add_argument("--hvp", type=int, nargs="*", default=[1], help="hvp probes (none: skip)")
    ap.add_argument("--sample", type=int, default=200, help="edges measured exactly")
    ap.add_argument("--top-each", type=int, default=30, help="each screen's top edges sampled")
    ap.add_argument("--seed", type=int, default=0, help="the sample's uniform draw")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--per-call", type=int, default=25, help="keep masks an exact call")
    ap.add_argument("--shares", type=float, nargs="*", default=[0.01, 0.05, 0.1, 0.2, 0.5])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not Path(args.model).exists():
        print(f"smollm2_edge_screens: {args.model} is not here (make smollm2): skipped")
        return 0
    torch.set_num_threads(args.threads)
    import pe_interp
    from pe_interp.util.hardware import cpu_has_bf16
    from probes.circuits import faithfulness_curve
    from probes.circuits.graph import build_graph

    print(
        f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, avx512_bf16 "
        f"{cpu_has_bf16()}, load {os.getloadavg()[0]:.1f}; float32",
        flush=True,
    )
    model = pe_interp.load(args.model, task="induction")
    task = model.origin.task
    sel = task.counterfactuals(args.n, kind="position", seed=0)
    held = task.counterfactuals(args.n, kind="position", seed=1)
    scored = screens(model, sel, args.steps, args.hvp, exact=False)
    atp = scored["atp"][0]
    valid = build_graph(model.cfg).valid
    total = int(valid.sum())
    print(
        f"SmolLM2-135M induction: {total} whole edges; position pairs, {args.n} to score (seed 0; "
        f"margin clean {atp.clean_metric:+.3f}, corrupt {atp.corrupt_metric:+.3f}), {args.n} held "
        f"out (seed 1)",
        flush=True,
    )
    for name, (_, t) in scored.items():
        print(f"  {name}: {t:.1f} s", flush=True)
    union, drawn = draw_sample(scored, valid, args.top_each, args.sample, args.seed)
    flat = np.concatenate([union, drawn])
    t0 = time.perf_counter()
    eff, full = exact_effects(model, sel, valid.shape, flat, args.per_call)
    t_exact = time.perf_counter() - t0
    print(
        f"sample: {len(flat)} edges = the union of each screen's top {args.top_each} by |score| "
        f"({len(union)} edges) + {len(drawn)} drawn uniformly from the other {total - len(union)} "
        f"(seed {args.seed}); exact single-edge ablation (corrupt term, everything else clean; "
        f"clean margin {full:+.3f}): {t_exact:.1f} s, {t_exact / len(flat):.2f} s an edge",
        flush=True,
    )
    exact = np.full(valid.size, np.nan)
    exact[flat] = eff
    uniform = np.full(valid.size, np.nan)
    uniform[drawn] = eff[len(union) :]
    sizes = sorted({int(round(x * total)) for x in [0.0, *args.shares, 1.0]})
    print(
        f"\n| screen | time | rho with exact (sample) | rho (uniform part) | recall of exact top "
        f"{args.top} | signs right (top {args.top}) | area | faithfulness at "
        f"{' '.join(f'{s / total:.0%}' for s in sizes[1:-1])} | curve time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (a, t) in scored.items():
        s = a.scores.reshape(-1)
        rho, recall, signs = agreement(s, exact, args.top)
        rho_u = agreement(s, uniform, 1)[0] if len(drawn) > 2 else float("nan")
        t0 = time.perf_counter()
        curve = faithfulness_curve(model, a, held, sizes=sizes, select="top")
        pts = " ".join(f"{r:.2f}" for r in curve["recovered"][1:-1])
        print(
            f"| {name} | {t:.1f} s | {rho:.2f} | {rho_u:.2f} | {recall:.2f} | {signs:.2f} | "
            f"{curve['area']:.3f} | {pts} | {time.perf_counter() - t0:.0f} s |",
            flush=True,
        )
    for name, (a, _) in scored.items():
        if "flagged" in a.meta:
            print(f"  {name}: {flags(a, atp.scores.reshape(-1), exact, args.top)} (in the sample)")
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

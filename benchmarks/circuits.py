"""Speed of attribution, path patching and the cheaper engines of head ablation, each against
its baseline measured in the same run (medians of ``--repeats``; one thread).

1. ``probes.attribute`` (node, edge; plain AtP) against TransformerLens' ``attribution_patch`` on a
   batch of 64 counterfactual pairs of a ``quick``-size model (the same scalar metric; checked
   equal before timing).
2. ``probes.path_patch`` over every head sender and receiver against TransformerLens'
   ``get_act_patch_direct_path_all_sources`` (q, k, v).
3. ``probes.faithfulness_curve`` of a circuit (the top 30 edges, whole; the top 150 edges at
   spans, position-aware) against TransformerLens' ``faithfulness`` on the same pairs, which it
   measures one at a time (checked equal pair by pair).
4. ``ablate_heads(engine="attribution", verify_top=k)`` (integrated gradients along the ablation
   path, 4 nodes, then ``k`` exact ablations) and ``ablate_heads(engine="sampled", sample=F,
   verify_top=3)`` (the exact grid on a share ``F`` of the examples, ``--sample``, then 3 exact
   ablations on all) against the exact full grid, at the ``quick`` size and at the paper's
   (6 layers x 16 heads, d_model 256, 120 positions); goal >= 3x at paper size.

    python benchmarks/circuits.py [--run runs/circuits-quick/rope] [--repeats 3] [--paper-n 256]

The machine may be shared: ratios are measured within one run, so they carry the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformer_lens import patching as tlp
from transformer_lens.tools.analysis import attribution_patching as ap

from pe_interp import HookedPETransformer, load_run
from pe_interp.config.presets import build_run_configs
from probes import ablate_heads, attribute, path_patch
from probes.ablation import Attribution, Sampled


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def quick_model(run: str | None):
    if run and (Path(run) / "config.json").is_file():
        r = load_run(run)
        return r.model.eval(), r.task, f"trained {run}"
    cfg, task, _ = build_run_configs("distance", "rope", "quick", 0)
    return HookedPETransformer(cfg).eval(), task, "random init, quick size"


def row(name: str, ours: float, base: float, goal: float | None = None) -> str:
    ratio = base / ours
    verdict = (
        "" if goal is None else f"  (goal >= {goal:g}x: {'met' if ratio >= goal else 'NOT met'})"
    )
    return f"| {name} | {ours:.3f} s | {base:.3f} s | {ratio:.1f}x{verdict} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--run", default="runs/circuits-quick/rope")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pairs", type=int, default=64)
    p.add_argument(
        "--paper-n",
        type=int,
        default=256,
        help="examples for the paper-size ablation timing (0: skip)",
    )
    p.add_argument(
        "--only-ablation", action="store_true", help="time the head-ablation engines alone (4.)"
    )
    p.add_argument(
        "--only-faithfulness", action="store_true", help="time faithfulness_curve alone (3.)"
    )
    p.add_argument(
        "--verify",
        type=int,
        nargs="*",
        default=[1, 3],
        help="verify_top values of engine='attribution' to time",
    )
    p.add_argument(
        "--sample",
        type=float,
        nargs="*",
        default=[0.2],
        help="sample shares of engine='sampled' to time",
    )
    p.add_argument("--skip-quick", action="store_true", help="in 4., time the paper size only")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, task, what = quick_model(args.run)
    pairs = task.counterfactuals(args.pairs, kind="position", seed=0)
    clean, corrupt = pairs.clean.tokens, pairs.corrupt.tokens
    print(
        f"model: {what}; {args.pairs} pairs of {clean.shape[1]} positions; medians of {args.repeats}; one thread\n"
    )
    print("| what | ours | baseline | speed-up |\n|---|---|---|---|")

    def tl_metric(logits):
        return (logits[:, 1] - logits[:, 0]).sum()

    def fn(logits, good, bad):
        return logits[:, 1] - logits[:, 0]

    skip_1_2 = args.only_ablation or args.only_faithfulness
    for gran in () if skip_1_2 else ("node", "edge"):
        cfg = ap.EdgeAttributionConfig(granularity=gran)
        t_ours, ours = timed(
            lambda g=gran: attribute(model, clean, corrupt, metric=fn, granularity=g), args.repeats
        )
        t_tl, tl = timed(
            lambda c=cfg: ap.attribution_patch(model, clean, corrupt, tl_metric, c),
            1 if gran == "edge" else args.repeats,
        )
        want = sum(tl.node_scores.values())
        got = float(np.nansum(ours.scores))
        assert abs(want - got) <= 1e-4 * max(1.0, abs(want)), (gran, want, got)  # the same numbers
        print(row(f"attribute, {gran} (vs attribution_patch)", t_ours, t_tl, 10))
    heads = [
        f"L{layer}H{h}" for layer in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)
    ]
    for comp in "" if skip_1_2 else "qkv":
        t_ours, ours = timed(
            lambda c=comp: path_patch(model, clean, corrupt, heads, heads, c, metric=fn),
            args.repeats,
        )

        def tl_all(c=comp):
            with torch.no_grad():
                cc = model.run_with_cache(clean)[1]
                kc = model.run_with_cache(corrupt)[1]
            return tlp.get_act_patch_direct_path_all_sources(
                model, corrupt, cc, kc, lambda lg: tl_metric(lg) / len(lg), c, verbose=False
            )

        t_tl, tl = timed(tl_all, 1)
        sl, sh = 0, 1
        assert (
            abs(
                float(tl[sl, sh, 1, 2])
                - ours.values[ours.senders.index("L0H1"), ours.receivers.index(f"L1H2.{comp}")]
            )
            < 1e-4
        )
        print(
            row(
                f"path_patch all head sources, {comp} (vs direct_path_all_sources)", t_ours, t_tl, 5
            )
        )
    from probes.circuits import circuit, faithfulness_curve

    if (
        not args.only_ablation
    ):  # TransformerLens' faithfulness measures one pair at a time: its loop over the pairs
        from probes.circuits.scores import span_ids

        ids = span_ids(task.spans(pairs.clean), None, clean.shape, "benchmark")[0]
        a = attribute(
            model,
            clean,
            corrupt,
            metric=fn,
            granularity="edge",
            spans=ids,
            span_names=task.span_names,
        )
        for label, c in (
            ("30 edges", circuit(a, top_n=30, select="top")),
            ("150 edges at spans", circuit(a, top_n=150, positional=True)),
        ):
            sp = ids if c.positional else None
            t_ours, ours = timed(
                lambda c=c, sp=sp: faithfulness_curve(
                    model, c, clean, corrupt, sizes=[len(c.edges)], metric=fn, spans=sp
                ),
                args.repeats,
            )

            def tl_loop(c=c):
                n_layers = model.cfg.n_layers
                return [
                    ap.faithfulness(
                        model,
                        clean[i : i + 1],
                        corrupt[i : i + 1],
                        tl_metric,
                        tl_edges(c, clean.shape[1], n_layers, ids[i] if c.positional else None),
                    )
                    for i in range(len(clean))
                ]

            t_tl, tl = timed(tl_loop, 1)
            for i, r in enumerate(tl):  # the same numbers, pair by pair
                got = (ours["per_example"][0, i] - r.corrupt_metric) / (
                    r.full_metric - r.corrupt_metric
                )
                assert abs(got - r.recovered) <= 1e-4 * max(1.0, abs(r.recovered)), (
                    label,
                    i,
                    got,
                    r.recovered,
                )
            print(
                row(
                    f"faithfulness_curve, {label}, {len(clean)} pairs (vs faithfulness, pair by pair)",
                    t_ours,
                    t_tl,
                )
            )
    if args.only_faithfulness:
        return 0
    test = task.sample(1000, seed=3)
    quick = () if args.skip_quick else (("quick", model, test),)
    for label, m, b in quick + ((("paper", *_paper(args.paper_n)),) if args.paper_n else ()):
        t_grid, grid = timed(
            lambda m=m, b=b: ablate_heads(
                m, b.tokens, b.labels, pad_mask=b.pad_mask, n_bootstrap=0
            ),
            1,
        )
        engines = [Attribution(verify_top=k) for k in args.verify] + [
            Sampled(share=f, verify_top=3) for f in args.sample
        ]
        for engine in engines:
            t_k, ranked = timed(
                lambda m=m, b=b, e=engine: ablate_heads(
                    m, b.tokens, b.labels, pad_mask=b.pad_mask, n_bootstrap=0, engine=e
                ),
                1,
            )
            same = np.nanargmax(ranked.drops) == np.nanargmax(grid.drops)
            print(
                row(
                    f"ablate_heads engine={engine!r}, {label} size, {len(b)} examples "
                    f"(vs exact grid; same top head: {bool(same)})",
                    t_k,
                    t_grid,
                    3 if label == "paper" else None,
                )
            )
    sys.stdout.flush()
    return 0


def tl_edges(c, n_pos: int, n_layers: int, spans=None) -> list:
    """The circuit's edges as TransformerLens ``Node`` pairs: at every position, or, for a
    position-aware circuit, at the positions of one example (``spans``: its span ids) in each
    unit's span."""

    def node(name: str, pos: int, reader: bool) -> ap.Node:
        if name == "embed":
            return ap.Node(kind="embed", position=pos)
        if name == "logits":
            return ap.Node(kind="logits", position=pos, layer=n_layers - 1)
        if name.startswith("MLP"):
            return ap.Node(
                kind="mlp_in" if reader else "mlp_out", position=pos, layer=int(name[3:])
            )
        head, _, comp = name.partition(".")
        layer, h = (int(x) for x in head[1:].split("H"))
        return ap.Node(
            kind=f"{comp}_input" if reader else "attn_head_out", position=pos, layer=layer, head=h
        )

    def at(i: int) -> range | list[int]:
        return (
            range(n_pos)
            if spans is None
            else [p for p in range(n_pos) if c.span_names.index(c.spans[i]) == int(spans[p])]
        )

    return [
        (node(w, p, False), node(r, p, True)) for i, (w, r) in enumerate(c.edges) for p in at(i)
    ]


def _paper(n: int):
    cfg, task, _ = build_run_configs("distance", "rope", "paper", 0)
    return HookedPETransformer(cfg).eval(), task.sample(n, seed=1)


if __name__ == "__main__":
    sys.exit(main())

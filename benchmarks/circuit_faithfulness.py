"""Faithfulness of the circuits attribution (or a learned mask) selects, against circuit size and
against the exact (ACDC) reference, on trained runs.

For each run directory, on one counterfactual family (default ``position``; margin metric):
edges scored by ``--method`` on ``--n`` pairs (seed 0), circuits measured on ``--n`` held-out
pairs (seed 1), other edges taking the corrupt run's values. For whole edges and for edges per
span (position-aware), and each order (``paths``: widest path, ``greedy``: Hanna et al.,
``top``: |score| alone, not connected):

- the faithfulness curve at shares of the graph (``--shares``), its area, and whether the
  position-aware curve lies above the whole-edge one at every share (same order): interpolated
  between the units each curve's circuits actually kept, and at each share asked (a budget: the
  largest circuit of at most that share, no interpolation, since a curve is a step function of
  the budget);
- the smallest circuit reaching ``--target`` (its size, share, measured faithfulness);
- with ``--method learned``: units ranked by mask logits learnt for faithfulness and sparsity on
  ``--learn-n`` selection pairs (:func:`probes.circuits.learned.learn_ranking`), one mask per
  granularity, measured the same way;
- with ``--acdc TAU``: the exact iterative-pruning circuit (:func:`probes.circuits.acdc.acdc`, on
  the selection pairs), its faithfulness on the held-out pairs, and the precision and recall of
  the attribution circuits against it: at the ACDC circuit's size, and the smallest faithful
  ones.

    python benchmarks/circuit_faithfulness.py runs/q-rope --acdc 0.01 --out faithfulness.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pe_interp import load_run
from pe_interp.util.io import atomic_write_json
from probes.circuits import attribute, faithfulness_curve, minimal_circuit, rank_edges
from probes.circuits.acdc import acdc, overlap
from probes.circuits.learned import learn_ranking
from probes.circuits.paths import prune


def evaluate(run_dir: str, args) -> dict:
    run = load_run(run_dir)
    model, task = run.model.eval(), run.task
    sel = task.counterfactuals(args.n, kind=args.family, seed=0)
    held = task.counterfactuals(args.n, kind=args.family, seed=1)
    grains = {"both": (False, True), "whole": (False,), "spans": (True,)}[args.granularity]
    t0 = time.perf_counter()
    learned = {}
    if args.method == "learned":  # one mask per granularity, learnt on --learn-n selection pairs
        pairs = task.counterfactuals(args.learn_n or args.n, kind=args.family, seed=0)
        for positional in grains:
            learned[positional] = learn_ranking(
                model,
                pairs,
                spans=task if positional else None,
                sparsity=args.sparsity,
                budget=args.budget,
                steps=args.steps,
                progress=True,
            )
        meta = next(iter(learned.values())).meta["learned"]
        clean, corrupt = meta["full"], meta["empty"]
    else:
        a = attribute(
            model,
            sel,
            method=args.method,
            granularity="edge",
            metric="margin",
            spans=task.spans(sel.clean),
            span_names=task.span_names,
        )
        clean, corrupt = a.clean_metric, a.corrupt_metric
    out = {
        "run": run_dir,
        "encoding": model.cfg.encoding_name,
        "task": task.name,
        "family": args.family,
        "method": args.method,
        "n": args.n,
        "attribute_seconds": time.perf_counter() - t0,
        "clean": clean,
        "corrupt": corrupt,
        "orders": {},
    }
    if (
        learned
    ):  # and the circuit each optimisation ended on (theta > 0, connected), on the held-out pairs
        out["learned"] = {}
        for k, r in learned.items():
            end = r.circuit_of(prune(r.graph, np.nan_to_num(r.scores["learned"], nan=-1.0) > 0))
            held_f = faithfulness_curve(model, end, held, spans=task if k else None)["recovered"][0]
            out["learned"]["spans" if k else "whole"] = {
                **r.meta["learned"],
                "total": r.total,
                "ended_size": len(end.edges),
                "ended_held_out": held_f,
            }
    rankings = {}
    for positional in grains:
        for select in args.select:
            if learned:
                r = learned[positional].reordered(select)
            else:
                r = rank_edges(a, select=select, positional=positional)
            rankings[positional, select] = r
            t0 = time.perf_counter()
            asked = {x: int(round(x * r.total)) for x in [0.0, *args.shares, 1.0]}
            sizes = sorted(set(asked.values()))
            curve = faithfulness_curve(model, r, held, sizes=sizes, spans=task)
            at_share = {x: curve["recovered"][sizes.index(n)] for x, n in asked.items()}
            c = minimal_circuit(model, r, held, target=args.target, spans=task)
            f = c.faithfulness
            out["orders"][f"{'spans' if positional else 'whole'}-{select}"] = {
                "total": r.total,
                "shares": [k / r.total for k in curve["kept"]],
                "recovered": curve["recovered"],
                "area": curve["area"],
                "at_share": at_share,
                "min_size": f["size"],
                "min_share": f["size"] / r.total,
                "min_kept": f["kept"],
                "min_area": f["area"],
                "seconds": time.perf_counter() - t0,
                "circuit": {
                    "edges": [list(e) for e in c.edges],
                    "spans": None if c.spans is None else list(c.spans),
                },
            }
            rankings[positional, select, "min"] = c
    for select in args.select if len(grains) == 2 else ():
        w, s = out["orders"][f"whole-{select}"], out["orders"][f"spans-{select}"]
        # the same shares of the graph were asked of both (a circuit's kept units may fall short of a share)
        above = [
            np.interp(x, s["shares"], s["recovered"])
            >= np.interp(x, w["shares"], w["recovered"]) - 1e-12
            for x in sorted(set(w["shares"]) | set(s["shares"]))
        ]
        out["orders"][f"spans-{select}"]["above_whole_everywhere"] = bool(all(above))
        # at each size asked (a budget: each granularity's largest circuit of at most that share), no interpolation
        budget = [s["at_share"][x] >= w["at_share"][x] - 1e-12 for x in w["at_share"]]
        out["orders"][f"spans-{select}"]["above_whole_at_every_budget"] = bool(all(budget))
    if args.acdc:
        out["acdc"] = {}
        for tau in args.acdc:
            for positional in grains:
                t0 = time.perf_counter()
                ref = acdc(model, sel, tau=tau, spans=task if positional else None, progress=True)
                seconds = time.perf_counter() - t0
                held_f = faithfulness_curve(model, ref, held, spans=task if positional else None)[
                    "recovered"
                ][0]
                entry = {
                    "size": len(ref.edges),
                    "total": ref.total_edges,
                    "share": len(ref.edges) / ref.total_edges,
                    "faithfulness_selection_pairs": ref.faithfulness["kept"],
                    "faithfulness_held_out": held_f,
                    "forwards": ref.meta["acdc"]["forwards"],
                    "seconds": seconds,
                    "against": {},
                }
                for select in args.select:
                    r = rankings[positional, select]
                    same = r.circuit(len(ref.edges))
                    entry["against"][select] = {
                        "same_size": overlap(same, ref),
                        "smallest_faithful": overlap(rankings[positional, select, "min"], ref),
                    }
                out["acdc"][f"{'spans' if positional else 'whole'}-tau{tau:g}"] = entry
    return out


def report(res: dict, target: float) -> None:
    print(
        f"\n{res['encoding']} {res['task']} ({res['run']}), {res['family']} pairs, {res['method']}, n={res['n']}: "
        f"clean margin {res['clean']:+.3f}, corrupt {res['corrupt']:+.3f} (scoring {res['attribute_seconds']:.0f} s)"
    )
    for name, L in res.get("learned", {}).items():
        how = f"budget {L['budget']:g}" if "budget" in L else f"sparsity {L['sparsity']:g}"
        print(
            f"  learned {name}: {L['size']} of {L['total']} units with theta > 0, recovering {L['recovered_hard']:.3f} "
            f"on the {L['n_pairs']} pairs it learnt on ({L['steps']} steps, {how}, {L['seconds']:.0f} s); "
            f"connected {L['ended_size']} ({L['ended_size'] / L['total']:.1%}), {L['ended_held_out']:.3f} on held-out pairs"
        )
    for name, o in res["orders"].items():
        pts = " ".join(f"{x:.0%}:{y:.2f}" for x, y in zip(o["shares"], o["recovered"]))
        extra = (
            ""
            if "above_whole_everywhere" not in o
            else (
                f", above whole edges at every share: {o['above_whole_everywhere']} (interpolated), "
                f"{o['above_whole_at_every_budget']} (at each size asked)"
            )
        )
        print(
            f"  {name:13s} area {o['area']:.3f}; smallest >= {target:g}: {o['min_size']} of {o['total']} "
            f"({o['min_share']:.1%}), faithfulness {o['min_kept']:.3f}{extra}\n      {pts}"
        )
    for select in [k.split("-", 1)[1] for k in res["orders"] if k.startswith("spans-")]:
        o = res["orders"][f"spans-{select}"]
        print(
            f"  goals ({select}): smallest position-aware circuit >= {target:g} holds {o['min_share']:.1%} of the "
            f"position-aware edges (<= 10%: {'met' if o['min_share'] <= 0.10 and o['min_kept'] >= target else 'NOT met'}); "
            f"position-aware curve above the whole-edge one at every share: "
            f"{ {True: 'met', False: 'NOT met', None: 'not compared (one granularity)'}[o.get('above_whole_everywhere')] } "
            f"(interpolated), { {True: 'met', False: 'NOT met', None: '-'}[o.get('above_whole_at_every_budget')] } "
            "(at each size asked)"
        )
    for name, e in res.get("acdc", {}).items():
        print(
            f"  ACDC {name}: {e['size']} of {e['total']} ({e['share']:.1%}), faithfulness {e['faithfulness_selection_pairs']:.3f}"
            f" (held out {e['faithfulness_held_out']:.3f}), {e['forwards']} forwards, {e['seconds']:.0f} s"
        )
        for select, o in e["against"].items():
            a, b = o["same_size"], o["smallest_faithful"]
            print(
                f"    {select:6s} same size: precision {a['precision']:.2f} recall {a['recall']:.2f}; smallest faithful "
                f"({b['found']}): precision {b['precision']:.2f} recall {b['recall']:.2f}"
            )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--family", default="position", choices=["position", "content", "both"])
    p.add_argument(
        "--method",
        default="eap-ig",
        choices=["eap-ig", "atp", "learned"],
        help="attribution scores, or masks learnt for faithfulness and sparsity (probes.circuits.learned)",
    )
    p.add_argument("--n", type=int, default=128)
    p.add_argument(
        "--learn-n",
        type=int,
        default=None,
        help="selection pairs to learn the masks on (default --n)",
    )
    p.add_argument(
        "--sparsity", type=float, default=0.5, help="learned: the weight of the mean mask"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="learned: the share of the units the circuit ends on, reached along a path (instead of --sparsity)",
    )
    p.add_argument("--steps", type=int, default=200, help="learned: Adam steps")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--select", nargs="+", default=["paths", "greedy", "top"])
    p.add_argument(
        "--shares", type=float, nargs="+", default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7]
    )
    p.add_argument(
        "--granularity",
        default="both",
        choices=["both", "whole", "spans"],
        help="whole edges, edges per span (position-aware), or both (the curve comparison needs both)",
    )
    p.add_argument(
        "--acdc",
        type=float,
        nargs="*",
        default=[],
        help="ACDC thresholds (fractions of the metric gap)",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for r in args.runs:
        if not (Path(r) / "model.safetensors").is_file():
            continue
        res = evaluate(r, args)
        results.append(res)
        report(res, args.target)
        if args.out:
            atomic_write_json(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``pe-interp circuit RUN_DIR``: the circuit of a trained run, position-aware and connected, with
every edge's positional and content score, the route into its top head and the circuit's
faithfulness.

1. The top head, from ``RUN_DIR/ablation.json`` (``pe-interp ablate``): the single-head deposit
   (:func:`probes.dominance`) when there is one, else the flagged head of the shallowest layer
   with layer concentration (:func:`probes.find_deposits`), else the head whose ablation hurts
   most; without that file, the head that hurts most by ``ablate_heads(engine="sampled")`` (the
   exact grid on a fifth of the examples, its top three verified on all of them; no verdict).
2. Edge scores (``--method``: ``eap-ig``, ``atp``, ``atp*`` or exact ``path_patch``) on the
   task's position-only and content-only counterfactuals, and on ``--counterfactual``'s family,
   which ranks the edges; per span of the examples (the task's ``prefix``, ``trigger1``,
   ``between``, ``trigger2``, ``suffix``, ``padding``; a prompt family's, e.g. induction's ``bos``,
   ``prefix``, ``cue``, ``answer``, ``after``, ``repeat``, ``query``: :mod:`pe_interp.prompts.spans`)
   unless ``--whole-edges`` (a prompts file names no spans: it needs it). ``--method
   learned``: the edges ranked by masks learnt for faithfulness and sparsity on that family's
   pairs (:func:`probes.circuits.learned.learn_ranking`, weight ``--sparsity``, or ``--budget``:
   the share of the edges to end on, reached along a path of circuits; minutes), each still shown
   with its EAP-IG position and content scores.
3. The circuit (``--select``, default ``paths``: every kept edge on a path from the embedding to
   the logits): with ``--faithful T`` the smallest one whose faithfulness reaches ``T`` on
   held-out pairs of that family (seed ``--seed + 1``), else the ``--top-n`` best; its
   faithfulness curve and the kept circuit's own faithfulness (other edges take the corrupt
   run's values).
4. Exact path patching of every writer into the top head's q, k and v under both families, and
   for a layer-0 head its logit terms (content, position, offset).

``--kv-view ungrouped``: under grouped key/value heads, a k and a v reader per query head (EAP-IG's
view; the default ``grouped`` has one per key/value head), in every step.

Writes ``RUN_DIR/circuit.json`` (or ``--out DIR``) (:meth:`probes.Circuit.load` reads it: the kept
``edges`` and their ``spans``, ``total_edges``, ``faithfulness`` with ``kept``; the route, the
top head and the curve) and ``RUN_DIR/circuit.html`` (offline).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from pe_interp.commands.circuit_head import Phases, read_route, top_head
from pe_interp.commands.circuit_page import body_html
from pe_interp.commands.circuit_search import check_settings, kept_circuit, learned_ranking
from pe_interp.commands.options import add_device_flag, add_model_dir_flags, seed_type

METHODS = ("eap-ig", "atp", "atp*", "path_patch", "learned")
SELECTS = ("paths", "greedy", "top")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "circuit",
        help="the circuit of a run: position and content edges, the route into its top head",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory written by `pe-interp train` (or a saved "
        "Hugging Face model directory, with --task)",
    )
    p.add_argument(
        "--counterfactual",
        default="position",
        choices=["position", "content", "both"],
        help="the family whose scores rank the edges and whose pairs measure faithfulness "
        "(position and content are always scored)",
    )
    p.add_argument(
        "--faithful",
        type=float,
        default=None,
        metavar="T",
        help="keep the smallest circuit whose faithfulness on held-out pairs reaches T (0 < T <= 1)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="with --faithful: end the search once the measured sizes either side of T are this "
        "close, relative to the larger (0: adjacent, one circuit per unit of the gap)",
    )
    p.add_argument("--top-n", type=int, default=30, help="edges kept (without --faithful)")
    p.add_argument(
        "--whole-edges",
        action="store_true",
        help="edges at every position, not per span of the examples",
    )
    p.add_argument(
        "--select",
        default=None,
        choices=SELECTS,
        help="paths (the default): by widest path from the embedding to the logits; greedy: from the logits "
        "down; top (the default with --aligned): by |score| alone (not connected)",
    )
    p.add_argument("--method", default="eap-ig", choices=METHODS)
    p.add_argument(
        "--kv-view",
        default="grouped",
        choices=["grouped", "ungrouped"],
        help="under grouped key/value heads: k/v readers per key/value head (grouped) or per query "
        "head (ungrouped, as EAP-IG)",
    )
    p.add_argument(
        "--aligned",
        action="store_true",
        help="with --method atp on position pairs: compare each token with itself at its moved position "
        "(scores and faithfulness), so that a unit blind to position scores 0",
    )
    p.add_argument(
        "--sparsity", type=float, default=0.5, help="--method learned: the weight of the mean mask"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="--method learned: the share of the units to end on (instead of --sparsity), e.g. 0.1",
    )
    p.add_argument(
        "--n", type=int, default=128, help="counterfactual pairs per family (and held-out pairs)"
    )
    p.add_argument(
        "--metric", default="margin", choices=["margin", "logit_diff", "logprob", "logit"]
    )
    p.add_argument("--seed", type=seed_type, default=0)
    p.add_argument("--no-progress", action="store_true", help="no phase lines or bars on stderr")
    add_device_flag(p, default="cpu")
    p.add_argument(
        "--out", default=None, help="where circuit.json and circuit.html go (default RUN_DIR)"
    )
    add_model_dir_flags(p)
    p.set_defaults(run=run)


def circuit_run(
    model,
    task,
    run,
    *,
    counterfactual="position",
    top_n=30,
    method="eap-ig",
    n=128,
    metric="margin",
    seed=0,
    faithful=None,
    positional=True,
    select=None,
    sparsity=0.5,
    budget=None,
    aligned=False,
    kv_view="grouped",
    tolerance=0.02,
    route_head=None,
    route=True,
    progress=False,
) -> tuple[Any, Any]:
    """The work of ``pe-interp circuit``: returns the circuit (route and curve in it) and the route.
    ``route_head``: ``((layer, head), where it comes from)`` for the route, instead of :func:`top_head`;
    ``route`` False: no route (the route None; exact path patching of every writer into a deep head
    costs a restarted forward per writer);
    ``progress``: each phase's line, and bars with an ETA for the long ones, on stderr."""
    from probes import family_attributions
    from probes.circuits import rank_edges

    select = check_settings(
        top_n, n, faithful, method, sparsity, budget, positional, aligned, counterfactual, select
    )
    model.check_forks()  # a model whose edges cannot be defined says what it lacks, before any work
    if positional and not task.span_names:
        raise ValueError(
            f"--task {task.name}: its prompts name no spans of their positions, so the edges "
            "cannot be position-aware; pass --whole-edges"
        )
    held_out = task.counterfactuals(n, kind=counterfactual, seed=seed + 1)
    if positional:  # rows with no one layout (unequal lengths) refuse here, before any forward
        task.spans(held_out.clean)
    say = Phases(progress)
    # first: a stale ablation.json refuses before the work (its head is the file's, or sampled)
    (layer, head), why = route_head or top_head(run, say=say)
    kinds = ["position", "content"] + ([counterfactual] if counterfactual == "both" else [])
    scorer = "eap-ig" if method == "learned" else method
    say(
        f"edge scores ({scorer}{', aligned' if aligned else ''}) on {n} pairs of {', '.join(kinds)}"
    )
    fams = family_attributions(
        model,
        task,
        n,
        kinds=kinds,
        seed=seed,
        method=scorer,
        metric=metric,
        positional=positional,
        aligned=aligned,
        kv_view=kv_view,
        progress=progress,
    )
    ranking = rank_edges(fams, select=select, positional=positional, by=counterfactual)
    if method == "learned":  # ordered by the learnt masks; each edge keeps its family scores
        ranking = learned_ranking(
            model,
            task,
            ranking,
            counterfactual,
            n,
            seed,
            positional,
            metric,
            sparsity,
            budget,
            select,
        )
    spans = task if positional else None
    say(f"faithfulness on {n} held-out pairs")
    c = kept_circuit(
        model, ranking, held_out, faithful, top_n, n, spans, metric, aligned, tolerance, progress
    )
    routed = None
    if route:
        routed = read_route(
            model, task, (layer, head), fams, say, n=n, seed=seed, metric=metric, kv_view=kv_view
        )
    say(None)
    meta = _meta(c, ranking, (layer, head), why, routed, counterfactual, n, seed, model, aligned)
    c.faithfulness["n_pairs"] = n
    return dataclasses.replace(c, meta=meta), routed


def _meta(c, ranking, top, why, route, counterfactual, n, seed, model, aligned) -> dict[str, Any]:
    """The circuit's meta: its top head and where it comes from, the route, the pairs."""
    from probes.circuits.graph import head_name

    meta = {
        **c.meta,
        "top_head": head_name(*top),
        "top_head_source": why,
        "route": None if route is None else route.to_dict(),
        "counterfactual": counterfactual,
        "n_pairs": n,
        "seed": seed,
        "held_out_seed": seed + 1,
        "encoding": model.cfg.encoding_name,
        "aligned": bool(aligned),
    }
    if "learned" in ranking.meta:
        meta["learned"] = {k: v for k, v in ranking.meta["learned"].items() if k != "history"}
    return meta


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.destinations import out_dir_arg, writing_run
    from pe_interp.commands.options import device_arg, model_dir_arg
    from pe_interp.prompts.task import is_prompt_task

    out_dir_arg(args.out)
    if args.faithful is not None and not 0 < args.faithful <= 1:
        raise ValueError(f"--faithful must be in (0, 1], got {args.faithful}")
    if not 0 <= args.tolerance < 1:
        raise ValueError(f"--tolerance must be in [0, 1), got {args.tolerance}")
    if is_prompt_task(args.task) and str(args.task).endswith(".jsonl") and not args.whole_edges:
        raise ValueError(
            f"--task {args.task}: a prompts file names no spans of its prompts' positions, so the "
            "edges cannot be position-aware; pass --whole-edges"
        )
    with writing_run(
        args.run_dir, device=device_arg(args.device), out=args.out, **model_dir_arg(args)
    ) as loaded:
        return _circuit(args, loaded)


def _circuit(args: argparse.Namespace, loaded) -> int:
    from pe_interp.runs.checkpoint import save_result
    from pe_interp.util.io import atomic_write_text
    from probes.circuits.view import circuit_page, circuit_summary, span_counts

    t0 = time.perf_counter()
    c, route = circuit_run(
        loaded.model,
        loaded.task,
        loaded,
        counterfactual=args.counterfactual,
        top_n=args.top_n,
        method=args.method,
        n=args.n,
        metric=args.metric,
        seed=args.seed,
        faithful=args.faithful,
        positional=not args.whole_edges,
        select=args.select,
        sparsity=args.sparsity,
        budget=args.budget,
        aligned=args.aligned,
        kv_view=args.kv_view,
        tolerance=args.tolerance,
        progress=not args.no_progress,
    )
    out = Path(args.out) if args.out else loaded.result_dir
    save_result(out / "circuit.json", c, loaded.provenance)
    title = (
        f"{c.meta['encoding']}: circuit ({c.method}, ranked by the {args.counterfactual} family)"
    )
    atomic_write_text(
        out / "circuit.html",
        circuit_page(c, title=title, body=body_html(c), highlight=c.meta["top_head"]),
    )
    print(
        f"{loaded.name}: {circuit_summary(c)}; top head {c.meta['top_head']}, {time.perf_counter() - t0:.1f} s"
    )
    if c.positional:
        print(f"  kept per span: {span_counts(c)}")
    share = c.share()
    into = c.into(c.meta["top_head"])[:5]
    print(
        f"  edges of the circuit into {c.meta['top_head']}:"
        if into
        else f"  no edge of the circuit enters {c.meta['top_head']}; its first edges:"
    )
    for i in into or range(min(5, len(c.edges))):
        print(
            f"  {c.label(i)}: position {c.scores['position'][i]:+.3f}, content {c.scores['content'][i]:+.3f}, "
            f"position share {share[i]:.2f}"
        )
    print(f"wrote {out / 'circuit.json'}, {out / 'circuit.html'}")
    return 0

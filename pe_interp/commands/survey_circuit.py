"""The survey's ``circuit`` step: the σ-aligned, position-aware circuit of the survey's prompts
(``pe-interp circuit MODEL --task FAMILY --faithful 0.9 --aligned --method atp``: scored on the
family's position-only pairs, its size chosen and its faithfulness measured on held-out pairs,
seed ``--seed + 1``), read beside the head the routes step ranks first (else the sampled
top-head ablation's), without the exact route into it. The step's file holds a digest, not the
circuit itself (a circuit of many thousand units is tens of MB): its faithfulness curve, its
units per span, every head's kept edges in and out with the rank of its first, the first
:data:`TOP_EDGES` units, and the units that read the route head."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TARGET", "TOP_EDGES", "circuit_digest", "circuit_step"]

TARGET = 0.9  # the faithfulness the circuit must reach on held-out pairs
TOP_EDGES = 40  # units of the circuit listed in the digest, in ranking order


def _route_head(out: Path) -> tuple[tuple[int, int], str] | None:
    """The head of the largest route share in ``out/routes.json`` (None without that file)."""
    try:
        shares = np.array(json.loads((out / "routes.json").read_text())["result"]["shares"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    layer, head = np.unravel_index(np.nanargmax(shares), shares.shape)
    return (int(layer), int(head)), "the largest route share (the routes step)"


def circuit_step(loaded, args: argparse.Namespace) -> dict[str, Any]:
    from pe_interp.commands.circuit import circuit_run
    from probes.circuits.view import circuit_summary

    c, _ = circuit_run(
        loaded.model,
        loaded.task,
        loaded,
        counterfactual="position",
        method="atp",
        aligned=True,
        faithful=TARGET,
        n=args.n,
        seed=args.seed,
        route_head=_route_head(Path(args.out)),
        route=False,  # the routes step measured where position enters; path patching every
        progress=True,  # writer into a deep head costs a restarted forward per writer
    )
    digest = circuit_digest(c)
    return {
        "result": digest | {"seed": args.seed},
        "n_used": args.n,
        "line": circuit_summary(c),
    }


def _edge_row(c, i: int) -> list[Any]:
    w, r = c.edges[i]
    return [w, r, c.spans[i] if c.positional else None] + [
        float(c.scores[k][i]) for k in ("position", "content")
    ]


def circuit_digest(c) -> dict[str, Any]:
    """What the survey keeps of a circuit (module docstring)."""
    heads: dict[str, dict[str, int]] = {}
    for i, (w, r) in enumerate(c.edges):
        for end, node in (("out", w), ("in", r.split(".")[0])):
            if not node.startswith("L"):  # the embedding, an MLP, the logits
                continue
            got = heads.setdefault(node, {"out": 0, "in": 0, "first": 0})
            got[end] += 1
            if end == "out" and not got["first"]:
                got["first"] = i + 1
    focus = c.meta["top_head"]
    reads = [i for i, (w, _) in enumerate(c.edges) if w == focus][:TOP_EDGES]
    return {
        "meta": {k: v for k, v in c.meta.items() if k != "route"},
        "faithfulness": c.faithfulness,
        "size": len(c.edges),
        "total_edges": int(c.total_edges),
        "method": c.method,
        "span_names": list(c.span_names),
        "span_counts": dict(Counter(c.spans)) if c.positional else {},
        "heads": heads,
        "top_edges": [_edge_row(c, i) for i in range(min(TOP_EDGES, len(c.edges)))],
        "readers_of_route_head": [[i + 1, *_edge_row(c, i)] for i in reads],
    }

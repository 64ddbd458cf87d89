"""The settings, the ranking and the search of ``pe-interp circuit``
(:func:`pe_interp.commands.circuit.circuit_run`): which settings go together, the edges ranked by
learnt masks (``--method learned``), and the circuit kept (the smallest reaching ``--faithful`` on
held-out pairs, else the ``--top-n`` best with the faithfulness curve around them)."""

from __future__ import annotations

import dataclasses


def check_settings(
    top_n, n, faithful, method, sparsity, budget, positional, aligned, counterfactual, select
) -> str:
    """Refuse settings that do not go together; returns the selection (``paths``, or ``top``
    with ``aligned``, unless one is named)."""
    if top_n < 1 or n < 2:
        raise ValueError(f"--top-n must be >= 1 and --n >= 2, got {top_n} and {n}")
    if faithful is not None and not 0 < faithful <= 1:
        raise ValueError(f"--faithful must be in (0, 1], got {faithful}")
    if method == "learned" and not (
        isinstance(sparsity, int | float) and 0 <= sparsity < float("inf")
    ):
        raise ValueError(f"--sparsity must be a finite number >= 0, got {sparsity}")
    if budget is not None and (method != "learned" or not 0 < budget < 1):
        raise ValueError(
            f"--budget is a share of the units in (0, 1) for --method learned, got {budget} with {method}"
        )
    if positional and method in ("atp*", "path_patch"):
        raise ValueError(
            f"--method {method} scores whole edges only; pass --whole-edges, or --method eap-ig or atp"
        )
    if aligned and (method != "atp" or counterfactual != "position"):
        raise ValueError(
            f"--aligned compares each token with itself moved: it needs --method atp and --counterfactual "
            f"position, got --method {method} --counterfactual {counterfactual}"
        )
    select = select or ("top" if aligned else "paths")
    if (
        aligned and select != "top"
    ):  # aligned, the embedding's term is the same token's: every edge out of it scores 0
        raise ValueError(
            f"--aligned: position enters at the routes themselves, so no path from the embedding carries "
            f"it; use --select top (its default), not {select}"
        )
    return select


def learned_ranking(
    model, task, ranking, counterfactual, n, seed, positional, metric, sparsity, budget, select
):
    """The edges ordered by masks learnt on the family's pairs, each with its family scores."""
    from probes.circuits.learned import learn_ranking

    pairs = task.counterfactuals(n, kind=counterfactual, seed=seed)
    learned = learn_ranking(
        model,
        pairs,
        spans=task if positional else None,
        metric=metric,
        sparsity=sparsity,
        budget=budget,
        select=select,
        progress=True,
        kv_view=ranking.graph.kv_view,  # the families' view
    )
    return dataclasses.replace(
        learned, scores=ranking.scores, meta={**ranking.meta, **learned.meta}
    )


def kept_circuit(
    model, ranking, held_out, faithful, top_n, n, spans, metric, aligned, tolerance, progress
):
    """The smallest circuit reaching ``faithful`` on the held-out pairs (to ``tolerance``: 8
    sizes, then 3 a round), else the ``top_n`` best edges with the faithfulness curve around them."""
    from probes.circuits import faithfulness_curve, minimal_circuit
    from probes.circuits.faithfulness import default_sizes

    if faithful is not None:
        return minimal_circuit(
            model,
            ranking,
            held_out,
            target=faithful,
            spans=spans,
            metric=metric,
            aligned=aligned,
            points=8,
            per_round=3,
            tolerance=tolerance,
            progress=progress,
        )
    c = ranking.circuit(top_n)
    sizes = sorted({*default_sizes(ranking.total, 12), len(c.edges)})
    curve = faithfulness_curve(
        model, ranking, held_out, sizes=sizes, spans=spans, metric=metric, aligned=aligned
    )
    curve.pop("per_example")
    at = curve["sizes"].index(len(c.edges))
    return dataclasses.replace(
        c,
        faithfulness={
            **curve,
            "kept": curve["recovered"][at],
            "size": len(c.edges),
            "n_pairs": n,
        },
    )

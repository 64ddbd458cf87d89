"""Circuits: attribution patching, exact path patching, and the circuits they select, over the
residual-stream graph of :mod:`probes.circuits.graph`.

- :mod:`~probes.circuits.graph`: writers, readers and edges; :mod:`~probes.circuits.engine`: the
  shared inputs, metrics, per-head forks and one hooked forward (and backward).
- :mod:`~probes.circuits.attribution`: AtP, AtP*, EAP-IG scores of nodes and edges, summed over
  positions, per position, or per span of the task's examples.
- :mod:`~probes.circuits.path_patching`: exact path patching of edges.
- :mod:`~probes.circuits.selection`: a :class:`Circuit` from edge scores, connected (every kept
  edge on a path from the embedding to the logits), and position-aware (an edge kept per span).
- :mod:`~probes.circuits.faithfulness`: a circuit run with every other edge ablated, the
  faithfulness curve over circuit size, its area, the smallest circuit that reaches a target.
- :mod:`~probes.circuits.acdc`: the exact reference, iterative edge pruning (ACDC).
- :mod:`~probes.circuits.learned`: units ranked by masks learnt for faithfulness and sparsity.
- :mod:`~probes.circuits.families`: every edge scored under each counterfactual family.
- :mod:`~probes.ablation.ranking`: heads ranked by integrated gradients along the ablation path.
- :mod:`~probes.circuits.route`, :mod:`~probes.circuits.agreement`, :mod:`~probes.circuits.view`:
  what enters one head, rank agreement, the offline graph.
"""

from probes.circuits.attribution import Attribution, attribute
from probes.circuits.faithfulness import (
    ABLATIONS,
    ablated_metric,
    curve_area,
    faithfulness_curve,
    minimal_circuit,
)
from probes.circuits.families import exact_edges, family_attributions, head_of
from probes.circuits.learned import learn_ranking
from probes.circuits.path_patching import PathPatch, path_patch
from probes.circuits.selection import SELECTIONS, Circuit, Ranking, circuit, prune, rank_edges

__all__ = [
    "ABLATIONS",
    "SELECTIONS",
    "Attribution",
    "Circuit",
    "PathPatch",
    "Ranking",
    "ablated_metric",
    "attribute",
    "circuit",
    "curve_area",
    "exact_edges",
    "faithfulness_curve",
    "family_attributions",
    "head_of",
    "learn_ranking",
    "minimal_circuit",
    "path_patch",
    "prune",
    "rank_edges",
]

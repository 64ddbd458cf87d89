"""How :func:`probes.ablation.ablate_heads` covers its grid: an engine is an object that holds its
own options (:class:`AblationEngine`), and a string is shorthand for one with its defaults.

- :class:`~probes.ablation.exact.Exact` (``"exact"``): every unit on every example;
- :class:`~probes.ablation.exact.Naive`: the slow reference loop (one full forward per ablation);
- :class:`~probes.ablation.sampled.Sampled` (``"sampled"``; ``share=0.2``, ``verify_top=3``): every
  head of the grid ablated exactly on a seeded random ``share`` of the examples, then the
  ``verify_top`` heads with the largest drops there on every example: a whole grid, the verified
  heads exact, the others unbiased estimates with intervals over the sample;
  ``meta["verification"]`` holds the verified heads' sampled against exact drops. On trained
  models it ranks heads like the exact grid to within the grid's own sampling noise
  (``benchmarks/head_ranking.py``);
- :class:`~probes.ablation.attribution.Attribution` (``"attribution"``; ``steps=4``,
  ``path="joint"``, ``verify_top=3``): every head ranked by integrated gradients along the ablation
  path (:func:`probes.ablation.ranking.rank_heads`: each head's output moved from its live value to
  the ablated one, ``steps`` Gauss-Legendre nodes, along ``path`` ``"joint"`` or ``"layer"``), in
  the units of the metric (accuracy: each example's margin change, counted as a flip where it
  crosses zero; loss; logit; a callable integrated itself), then the ``verify_top`` heads estimated
  to hurt most ablated exactly. The result is a grid with those heads' exact values and NaN
  elsewhere; ``meta`` holds the estimates (``"attribution"``), the stand-in, the verified heads and
  ``"verification"``: their estimates against their exact drops. Its top head is exact among the
  verified; :func:`probes.find_deposits` refuses the partial grid (a deposit verdict needs every
  head of a layer). ``path="hvp"`` ranks by the clean point's second-order estimate and verifies
  the heads it flags as well (``verify_flagged``: Screen-Flag-Fix).

Each engine checks its options when it is made (a one-line ``ValueError``), and says what it cannot
run (``grid_only``: head sets, for the ranking engines), which the one input check refuses before
any work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from probes.ablation.attribution import Attribution
from probes.ablation.exact import Exact, Naive
from probes.ablation.sampled import Sampled
from probes.common.options import ENGINES

if TYPE_CHECKING:
    from probes.ablation.request import AblationRequest
    from probes.ablation.result import AblationResult

__all__ = [
    "AblationEngine",
    "Attribution",
    "Exact",
    "Naive",
    "Sampled",
    "as_engine",
    "check_engine",
]


class AblationEngine(Protocol):
    """What :func:`probes.ablation.ablate_heads` asks of an engine."""

    name: str
    grid_only: bool  # it ranks the single heads of a grid: head sets are refused

    def run(self, req: AblationRequest) -> AblationResult:
        """The sweep's result."""
        ...


_SHORTHAND = {"exact": Exact, "sampled": Sampled, "attribution": Attribution}
assert tuple(_SHORTHAND) == ENGINES


def as_engine(engine: Any) -> AblationEngine:
    """An engine object, or the engine a string names with its defaults (one-line ValueError else)."""
    if isinstance(engine, str) and engine in _SHORTHAND:
        return _SHORTHAND[engine]()
    if not isinstance(engine, str) and all(
        hasattr(engine, a) for a in ("name", "grid_only", "run")
    ):
        return engine  # an engine object, ours or the caller's own
    raise ValueError(
        f"unknown engine {engine!r}; expected one of {', '.join(map(repr, ENGINES))} or an engine "
        "object: Exact(), Sampled(share=, verify_top=), Attribution(steps=, path=, verify_top=)"
    )


def check_engine(engine: Any, head_sets: bool) -> AblationEngine:
    """:func:`as_engine`, and a one-line ValueError where it cannot run ``head_sets``."""
    engine = as_engine(engine)
    if head_sets and engine.grid_only:
        raise ValueError(
            f"engine={engine.name!r} ranks single heads; it takes layers/heads, not head_sets"
        )
    return engine

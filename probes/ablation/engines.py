"""How :func:`probes.ablation.ablate_heads` covers its grid: an engine is an object that holds its
own options (:class:`AblationEngine`), and a string is shorthand for one with its defaults.

- :class:`~probes.ablation.exact.Exact` (``"exact"``): every unit on every example;
- :class:`~probes.ablation.exact.Naive`: the slow reference loop (one full forward per ablation);
- :class:`~probes.ablation.sampled.Sampled` (``"sampled"``; ``share``, ``verify_top``): the exact
  grid on a seeded share of the examples, then the top heads there on every example;
- :class:`~probes.ablation.attribution.Attribution` (``"attribution"``; ``steps``, ``path``,
  ``verify_top``): integrated gradients along the ablation path rank every head, the top ones are
  ablated exactly.

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

"""σ-alignment: on a position-only pair (the corrupt row holds the clean row's tokens moved,
``x'[σ(i)] = x[i]``) read the corrupt run at each clean token's moved position, so that a unit
blind to position has equal values in both runs (:func:`probes.attribute`'s ``aligned``, and the
faithfulness ablation's, whose corrupt :class:`~probes.common.replace.Replacement` reads its rows
at σ). :func:`align` itself lives with the replacements (:mod:`probes.common.replace`)."""

from __future__ import annotations

from torch import Tensor

from probes.circuits.engine import Run
from probes.common.inputs import position_permutation
from probes.common.replace import align


def moved(clean: Run, corrupt: Run | None, who: str) -> Tensor:
    """``σ [n, pos]`` of a position-only pair (``corrupt[b, σ[b, i]]`` is ``clean[b, i]``), for
    σ-aligned scores; a one-line error for any other pair."""
    if corrupt is None:
        raise ValueError(
            f"{who}: aligned=True compares each token with itself moved; it needs position-only pairs"
        )
    try:
        return position_permutation(clean.tokens, corrupt.tokens)
    except ValueError as err:
        raise ValueError(f"{who}: aligned=True: {err}") from None


__all__ = ["align", "moved"]

"""A checked head-ablation sweep (:class:`AblationRequest`): what the engines run, made only by the
one input check, :func:`probes.ablation.plan.check_request`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from probes.ablation.result import Head
from probes.ablation.sweeps import Sweep
from probes.common.metrics import Metric

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["AblationRequest", "default_batch_size"]


@dataclass(frozen=True, eq=False)
class AblationRequest:
    """A checked ablation sweep: what the engines run."""

    model: Any  # a ProbeModel
    tokens: Tensor  # [batch, pos] int64 on the model's device
    labels: Tensor  # [batch]
    pad_mask: Tensor  # [batch, pos] bool, True at real tokens
    units: list[tuple[Head, ...]]  # what each ablation removes
    grid: bool  # units are the single heads of a layers x heads grid (else head_sets)
    method: str
    metric: Metric
    reference: tuple[Tensor, Tensor] | None  # checked (tokens, pad_mask); None: the evaluated set
    per_example: bool
    n_bootstrap: int
    ci: float
    seed: int
    batch_size: int
    progress: bool
    amp: bool
    who: str = "ablate_heads"
    reference_given: bool = False
    engine: Any = None  # the AblationEngine that runs it (probes.ablation.engines)

    @property
    def sweep(self) -> Sweep:
        """The exact sweep this request runs (:func:`probes.ablation.sweeps.exact_sweep`)."""
        return Sweep(
            self.model,
            self.tokens,
            self.labels,
            self.pad_mask,
            self.units,
            self.metric,
            self.batch_size,
            self.progress,
        )


def default_batch_size(model: ProbeModel) -> int:
    """Rows per forward when not given: 128 on CPU, where larger batches fall out of cache and
    run slower per row (measured at the paper's size), 2048 on an accelerator."""
    return 128 if model.W_E.device.type == "cpu" else 2048

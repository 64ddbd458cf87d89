"""What activation patching returns (:func:`probes.patching.sweep.patch`): :class:`PatchResult`, which
saves and loads itself."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pe_interp.util.io import load_result, nan_array, register_result, write_result

__all__ = ["RESULT_KIND", "PatchResult"]


# ---------------------------------------------------------------------------------------------
# result
# ---------------------------------------------------------------------------------------------
RESULT_KIND = register_result(
    "patching", "PatchResult.load", ("site", "by_position", "direction", "values", "axis_names")
)


@dataclass(frozen=True, eq=False)
class PatchResult:
    """What :func:`patch` returns.

    - ``values``: the metric per patch cell, shaped like the matching TransformerLens function's
      output (``axis_names`` names the axes; the first is always ``layer`` and indexes ``layers``).
    - ``per_example``: ``values.shape + (n_examples,)``; its mean over the last axis is
      ``values`` (None for a custom scalar metric).
    - ``ci_low``/``ci_high``: percentile-bootstrap interval of ``values`` at ``ci_level``
      (None without per-example values or with ``n_bootstrap=0``).
    - ``clean_value``/``corrupt_value``: the metric on the unpatched clean and corrupt runs
      (1 and 0 for the default metric).
    - ``extra``: for the default metric, the mean clean and corrupt logit differences and
      ``denominator_z``, the normaliser ``mean(ld_clean - ld_corrupt)`` over its standard error;
      when it is small (say < 3) the pairs barely separate the labels and normalised values are
      noisy and can be far outside [0, 1].
    """

    values: Tensor
    per_example: Tensor | None
    ci_low: Tensor | None
    ci_high: Tensor | None
    site: str
    by_position: bool
    direction: str
    layers: tuple[int, ...]
    axis_names: tuple[str, ...]
    metric_name: str
    clean_value: float
    corrupt_value: float
    n_examples: int
    n_bootstrap: int
    ci_level: float = 0.95
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def stderr(self) -> Tensor | None:
        """Standard error of the mean over examples (None without per-example values)."""
        if self.per_example is None or self.n_examples < 2:
            return None
        return self.per_example.std(dim=-1) / math.sqrt(self.n_examples)

    def top(self, k: int = 5, *, by_abs: bool = True) -> list[tuple[dict[str, int], float]]:
        """The ``k`` cells with the largest (absolute) values, as ``({axis: index}, value)``."""
        flat = self.values.flatten()
        score = flat.abs() if by_abs else flat
        score = torch.nan_to_num(score, nan=-math.inf)
        order = score.argsort(descending=True)[: max(0, k)]
        out = []
        for i in order.tolist():
            idx = list(torch.unravel_index(torch.tensor(i), self.values.shape))
            cell = {name: int(j) for name, j in zip(self.axis_names, idx)}
            cell["layer"] = self.layers[cell["layer"]]
            out.append((cell, float(flat[i])))
        return out

    def to_dict(self, per_example: bool = False) -> dict[str, Any]:
        """JSON-able summary (per-example values only when asked: they can be large)."""

        def lst(t: Tensor | None):
            return None if t is None else t.detach().cpu().double().tolist()

        out: dict[str, Any] = {
            "site": self.site,
            "by_position": self.by_position,
            "direction": self.direction,
            "layers": list(self.layers),
            "axis_names": list(self.axis_names),
            "shape": list(self.shape),
            "metric": self.metric_name,
            "clean_value": self.clean_value,
            "corrupt_value": self.corrupt_value,
            "n_examples": self.n_examples,
            "n_bootstrap": self.n_bootstrap,
            "ci_level": self.ci_level,
            "values": lst(self.values),
            "ci_low": lst(self.ci_low),
            "ci_high": lst(self.ci_high),
            "top": [{"cell": c, "value": v} for c, v in self.top(10)],
            **{
                k: v
                for k, v in self.extra.items()
                if v is None or isinstance(v, int | float | str | bool)
            },
        }
        if per_example:
            out["per_example"] = lst(self.per_example)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PatchResult:
        """Invert :meth:`to_dict` (tensors come back as float64; keys it does not know, such as
        what ``pe-interp patch`` adds, land in ``extra``)."""

        def tensor(x: Any) -> Tensor | None:
            return None if x is None else torch.from_numpy(nan_array(x))

        return cls(
            values=tensor(d["values"]),
            per_example=tensor(d.get("per_example")),
            ci_low=tensor(d.get("ci_low")),
            ci_high=tensor(d.get("ci_high")),
            site=d["site"],
            by_position=bool(d["by_position"]),
            direction=d["direction"],
            layers=tuple(int(i) for i in d["layers"]),
            axis_names=tuple(d["axis_names"]),
            metric_name=d["metric"],
            clean_value=float(d["clean_value"]),
            corrupt_value=float(d["corrupt_value"]),
            n_examples=int(d["n_examples"]),
            n_bootstrap=int(d["n_bootstrap"]),
            ci_level=float(d.get("ci_level", 0.95)),
            extra={k: v for k, v in d.items() if k not in _SAVED_FIELDS},
        )

    def save(self, path: str | Path, per_example: bool = False) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(per_example=per_example))

    @classmethod
    def load(cls, path: str | Path) -> PatchResult:
        return load_result(path, RESULT_KIND, cls.from_dict)


# the keys PatchResult.to_dict writes for its own fields (the rest of a saved dict is ``extra``)
_SAVED_FIELDS = {
    "site",
    "by_position",
    "direction",
    "layers",
    "axis_names",
    "shape",
    "metric",
    "clean_value",
    "corrupt_value",
    "n_examples",
    "n_bootstrap",
    "ci_level",
    "values",
    "ci_low",
    "ci_high",
    "top",
    "per_example",
    "kind",
}

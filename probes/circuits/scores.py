"""What attribution returns: :class:`Attribution`, the scores of every node or edge (summed over
positions, per position, per span of the examples), saved and loaded as JSON; and the check of
the span ids that :func:`probes.circuits.attribution.attribute` and faithfulness take."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.util.io import (
    load_result,
    nan_array,
    register_result,
    to_json,
    write_result,
)
from probes.circuits.graph import head_name

RESULT_KIND = register_result(
    "attribution", "Attribution.load", ("method", "granularity", "writers", "readers", "scores")
)


@dataclass(frozen=True, eq=False)
class Attribution:
    """What :func:`attribute` returns. ``scores`` is ``[writers]`` (node) or ``[readers, writers]``
    (edge, NaN where there is no edge); ``by_position`` adds a last axis of positions, ``by_span``
    one of the examples' spans (``span_names``: each example's score summed over the positions of
    that span, then the mean over examples; the spans sum to ``scores``); ``magnitude``
    (``"atp*"``) is the GradDrop magnitude with ``scores``' shape."""

    method: str
    granularity: str
    mode: str  # denoise | noise | zero | mean
    metric: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    scores: np.ndarray
    n_examples: int
    n_layers: int
    n_heads: int
    steps: int = 1
    clean_metric: float = float("nan")
    corrupt_metric: float = float("nan")
    by_position: np.ndarray | None = None
    magnitude: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    span_names: tuple[str, ...] = ()
    by_span: np.ndarray | None = None

    @property
    def ranking(self) -> np.ndarray:
        """What orders nodes or edges: ``magnitude`` for ``"atp*"``, else ``|scores|``."""
        return self.magnitude if self.magnitude is not None else np.abs(self.scores)

    def node_scores(self) -> dict[str, float]:
        """Each writer's score (for edges: the sum of its outgoing edges)."""
        s = self.scores if self.granularity == "node" else np.nansum(self.scores, axis=0)
        return dict(zip(self.writers, s.tolist()))

    def head_scores(self) -> np.ndarray:
        """``[n_layers, n_heads]`` node scores of the heads."""
        nodes = self.node_scores()
        return np.array(
            [
                [nodes[head_name(layer, h)] for h in range(self.n_heads)]
                for layer in range(self.n_layers)
            ]
        )

    def edge(self, writer: str, reader: str) -> float:
        self._need_edges()
        return float(self.scores[self.readers.index(reader), self.writers.index(writer)])

    def edge_scores(self) -> dict[tuple[str, str], float]:
        """``{(writer, reader): score}`` over the edges that exist."""
        self._need_edges()
        r, w = np.nonzero(~np.isnan(self.scores))
        return {(self.writers[j], self.readers[i]): float(self.scores[i, j]) for i, j in zip(r, w)}

    def top_edges(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The ``k`` edges that rank highest (see :attr:`ranking`), as ``(writer, reader, score)``."""
        self._need_edges()
        rank = np.nan_to_num(self.ranking, nan=-np.inf).ravel()
        out = []
        for i in np.argsort(-rank, kind="stable")[:k]:
            r, w = divmod(int(i), len(self.writers))
            out.append((self.writers[w], self.readers[r], float(self.scores[r, w])))
        return out

    def _need_edges(self) -> None:
        if self.granularity != "edge":
            raise ValueError(
                "this Attribution holds node scores; run attribute(..., granularity='edge')"
            )

    def to_dict(self, by_position: bool = False) -> dict[str, Any]:
        return {
            "method": self.method,
            "granularity": self.granularity,
            "mode": self.mode,
            "metric": self.metric,
            "writers": list(self.writers),
            "readers": list(self.readers),
            "scores": to_json(self.scores),
            "n_examples": self.n_examples,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "steps": self.steps,
            "clean_metric": to_json(self.clean_metric),
            "corrupt_metric": to_json(self.corrupt_metric),
            "by_position": to_json(self.by_position) if by_position else None,
            "magnitude": to_json(self.magnitude),
            "meta": to_json(self.meta),
            "span_names": list(self.span_names),
            "by_span": to_json(self.by_span),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attribution:
        nan = float("nan")
        return cls(
            method=d["method"],
            granularity=d["granularity"],
            mode=d["mode"],
            metric=d["metric"],
            writers=tuple(d["writers"]),
            readers=tuple(d["readers"]),
            scores=nan_array(d["scores"]),
            n_examples=int(d["n_examples"]),
            n_layers=int(d["n_layers"]),
            n_heads=int(d["n_heads"]),
            steps=int(d.get("steps", 1)),
            clean_metric=nan if d.get("clean_metric") is None else float(d["clean_metric"]),
            corrupt_metric=nan if d.get("corrupt_metric") is None else float(d["corrupt_metric"]),
            by_position=nan_array(d.get("by_position")),
            magnitude=nan_array(d.get("magnitude")),
            meta=dict(d.get("meta") or {}),
            span_names=tuple(d.get("span_names") or ()),
            by_span=nan_array(d.get("by_span")),
        )

    def save(self, path: str | Path, by_position: bool = False) -> Path:
        return write_result(
            path, RESULT_KIND, self.to_dict(by_position), indent=None, sort_keys=False
        )

    @classmethod
    def load(cls, path: str | Path) -> Attribution:
        return load_result(path, RESULT_KIND, cls.from_dict)


def span_ids(spans: Any, names: Any, shape: tuple, who: str) -> tuple[Tensor, tuple[str, ...]]:
    """Checked ``[n, pos]`` span ids and their names (default ``"span0"``, ``"span1"``, ...)."""
    ids = torch.as_tensor(spans)
    if ids.shape != tuple(shape) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(
            f"{who}: spans must be integer span ids of the examples' shape {tuple(shape)}, got "
            f"{ids.dtype} {tuple(ids.shape)}"
        )
    ids = ids.long()
    k = int(ids.max()) + 1 if names is None else len(names)
    if int(ids.min()) < 0 or int(ids.max()) >= k:
        raise ValueError(
            f"{who}: span ids must be in 0..{k - 1} (one per name), got {int(ids.min())}..{int(ids.max())}"
        )
    return ids, tuple(f"span{i}" for i in range(k)) if names is None else tuple(
        str(x) for x in names
    )


__all__ = ["Attribution", "span_ids"]

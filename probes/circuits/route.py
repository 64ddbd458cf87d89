"""What enters one head through its query, key and value, and from where, under each
counterfactual family; and, for a layer-0 head, how its logits split into content, position and
offset terms (:func:`probes.logit_terms`).

:func:`head_route` path-patches every writer that can reach the head into each of its q, k and v
inputs (exact, :func:`probes.path_patch`) on ``task.counterfactuals(n, kind)`` for each family,
and adds the attribution estimates of the same edges when given. At layer 0 the only writer is
the token embedding: what the position counterfactual moves there is which token sits where,
and the encoding's own position term (rotation, bias or the absolute vector, all the same in
clean and corrupt) is read from the logit decomposition instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pe_interp.util.io import (
    load_result,
    register_result,
    to_json,
    write_result,
)
from probes.circuits.graph import (
    COMPONENTS,
    build_graph,
    check_kv_view,
    head_name,
    parse,
    reader_of,
)
from probes.circuits.path_patching import path_patch
from probes.circuits.scores import Attribution
from probes.decomposition import logit_terms

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

RESULT_KIND = register_result(
    "head route", "HeadRoute.load", ("head", "metric", "n_examples", "exact", "layer0")
)


@dataclass(frozen=True, eq=False)
class HeadRoute:
    """``exact[kind][component][sender]``: the metric's change with that one edge patched (clean
    into corrupt); ``estimate`` the same from attribution (empty without it); ``layer0`` the
    mean variance shares and Toeplitz scores of the head's grouped logit terms (layer 0 only)."""

    head: str
    metric: str
    n_examples: int
    exact: dict[str, dict[str, dict[str, float]]]
    estimate: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    gaps: dict[str, float] = field(default_factory=dict)  # kind -> m(clean) - m(corrupt)
    layer0: dict[str, Any] | None = None
    kv_view: str = "grouped"  # "ungrouped": the routes into the head's own k and v readers

    def table(self) -> list[dict[str, Any]]:
        """One row per (family, component, sender), largest exact effect first."""
        rows = []
        for kind, comps in self.exact.items():
            for comp, senders in comps.items():
                for s, v in senders.items():
                    est = self.estimate.get(kind, {}).get(comp, {}).get(s)
                    rows.append(
                        {
                            "family": kind,
                            "component": comp,
                            "sender": s,
                            "exact": v,
                            "estimate": est,
                        }
                    )
        return sorted(rows, key=lambda r: -abs(r["exact"]))

    def to_dict(self) -> dict[str, Any]:
        return to_json(
            {
                "head": self.head,
                "metric": self.metric,
                "n_examples": self.n_examples,
                "exact": self.exact,
                "estimate": self.estimate,
                "gaps": self.gaps,
                "layer0": self.layer0,
                "kv_view": self.kv_view,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadRoute:
        return cls(
            d["head"],
            d["metric"],
            int(d["n_examples"]),
            d["exact"],
            d.get("estimate") or {},
            d.get("gaps") or {},
            d.get("layer0"),
            d.get("kv_view", "grouped"),  # records before the view: grouped
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=1, sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> HeadRoute:
        return load_result(path, RESULT_KIND, cls.from_dict)


def layer0_terms(model: ProbeModel, batch, head: int, n: int = 16) -> dict[str, Any]:
    """Mean over ``n`` rows of ``batch`` of a layer-0 head's grouped logit terms (content-content,
    content-position, ..., offset, relative_bias): each one's share of the logit variance and its
    Toeplitz score (how much of it is a function of the offset ``j - i`` alone); plus, for a
    rotary head, each frequency pair's share."""
    shares: dict[str, list[float]] = {}
    toeplitz: dict[str, list[float]] = {}
    freq = []
    from probes.decomposition import toeplitz_score

    for i in range(min(n, len(batch))):
        t = logit_terms(model, batch.tokens, 0, head, pad_mask=batch.pad_mask, example=i)
        grouped, region = t.grouped(), t.region
        total = t.total[region].double().var(unbiased=False)
        for name, m in grouped.items():
            shares.setdefault(name, []).append(
                float(m[region].double().var(unbiased=False) / total)
            )
            toeplitz.setdefault(name, []).append(float(toeplitz_score(m, region)))
        if t.rope is not None:
            freq.append(t.rope.frequency_share().double().numpy())
    out: dict[str, Any] = {
        "variance_share": {k: float(np.mean(v)) for k, v in shares.items()},
        "toeplitz": {  # NaN where no row's term had a Toeplitz score (said as a dash in the page)
            k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
            for k, v in toeplitz.items()
        },
        "n_examples": min(n, len(batch)),
    }
    if freq:
        out["rope_frequency_share"] = np.mean(freq, axis=0).tolist()
    return out


def head_route(
    model: ProbeModel,
    task,
    head: str | tuple[int, int],
    *,
    n: int = 256,
    kinds: Sequence[str] = ("position", "content"),
    metric: str = "margin",
    seed: int = 0,
    attributions: Mapping[str, Attribution] | None = None,
    batch_size: int | None = None,
    kv_view: str = "grouped",
    progress: bool = False,
) -> HeadRoute:
    """The route into ``head`` under each family (see the module docstring). ``attributions``
    (one edge attribution per family, e.g. :func:`probes.family_attributions`) adds estimates.
    ``kv_view``: ``"ungrouped"`` routes into the head's own k and v, not its key/value head's;
    ``progress``: a bar of the path patchings (a family's q, k or v each), with an ETA."""
    name = head_name(*head) if isinstance(head, tuple | list) else str(head)
    site = parse(name)
    if site.kind != "head":
        raise ValueError(f"head_route: {name!r} is not a head")
    check_kv_view(kv_view, "head_route")
    graph = build_graph(model.cfg, kv_view)
    exact: dict[str, dict[str, dict[str, float]]] = {}
    estimate: dict[str, dict[str, dict[str, float]]] = {}
    gaps = {}
    bar = _bar(len(kinds) * len(COMPONENTS), name) if progress else None
    for kind in kinds:
        pairs = task.counterfactuals(n, kind=kind, seed=seed)
        exact[kind], estimate[kind] = {}, {}
        for comp in COMPONENTS:
            reader = reader_of(site.layer, site.head, comp, graph)
            senders = [
                w
                for w in graph.writers
                if graph.valid[graph.reader_index(reader), graph.writer_index(w)]
            ]
            pp = path_patch(
                model,
                pairs,
                None,
                senders,
                [reader],
                comp,
                metric=metric,
                batch_size=batch_size,
                kv_view=kv_view,
            )
            exact[kind][comp] = {s: float(pp.effects[i, 0]) for i, s in enumerate(pp.senders)}
            gaps[kind] = pp.clean_metric - pp.corrupt_metric
            a = (attributions or {}).get(kind)
            if a is not None:
                estimate[kind][comp] = {s: a.edge(s, reader) for s in senders}
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    layer0 = None
    # not over a bridge's BLOOM (ALiBi unseen), nor where layer 0's norms cannot be frozen
    if site.layer == 0 and model.encoding.decomposes and not model.encoding.unfrozen_norms(0):
        # a synthetic task samples its rows; natural prompts are their own held-out rows
        rows = task.sample(16, seed=seed) if hasattr(task, "sample") else task.prompts
        layer0 = layer0_terms(model, rows, site.head)
    estimate = {k: v for k, v in estimate.items() if v}
    return HeadRoute(name, metric, n, exact, estimate, gaps, layer0, kv_view)


def _bar(total: int, name: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"route into {name}", unit="path patching")


__all__ = ["HeadRoute", "head_route", "layer0_terms"]

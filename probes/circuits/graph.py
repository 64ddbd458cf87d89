"""The residual-stream graph that attribution, path patching and circuits score: its nodes, its
edges, and the names both carry.

**Writers** put a term into the residual stream: ``"embed"`` (the token embedding,
``hook_embed``), each head ``"L{l}H{h}"`` (``z_h W_O[h]``, read at ``attn.hook_z``) and each
MLP ``"MLP{l}"`` (``hook_mlp_out``). Where a norm follows a block's attention or MLP (Gemma 2 and
3, OLMo 2) a writer's term is read inside it (an MLP's at the norm's input) and the norm maps the
block's sum to the residual (:mod:`probes.circuits.post_norm`). The positional term of an absolute encoding
(``hook_pos_embed``) and the output biases are the same in every run, so they are no writer.

**Readers** read the residual stream: each head's query, key and value input ``"L{l}H{h}.q"``,
``".k"``, ``".v"`` (TransformerLens' per-head forks ``attn.hook_q/k/v_input``), each MLP's input
``"MLP{l}"`` (``hook_mlp_in``) and the readout ``"logits"`` (the last ``hook_resid_post``).
Readers follow the model's structure: where query heads share key/value heads (grouped-query
attention, ``n_kv_heads < n_heads``; multi-query at ``n_kv_heads = 1``) the k and v forks are one
per key/value head, and so are the readers, ``"L{l}KV{g}.k"`` and ``"L{l}KV{g}.v"``, read by the
query heads ``g * group .. (g + 1) * group - 1`` (:class:`pe_interp.models.protocol.KVLayout`);
the q readers stay one per query head. :func:`reader_of` names the k/v reader a head reads.

The **ungrouped view** (``kv_view="ungrouped"``, as EAP-IG's ``ungroup_grouped_query_attention``
has it) gives grouped key/value heads a k and a v reader per query head too, ``"L{l}H{h}.k|v"``:
query head ``h`` reads its own copy of its key/value head's input, so an edge into it moves the
key (value) that head ``h`` attends with and no other head's. That is the graph of the model with
each key/value head copied to every query head of its group; the engine runs it as
:attr:`Graph.kv_split` copies of each forward (:func:`probes.circuits.engine.merge_hooks`).
Attribution scores then sum over each group to the grouped view's (the chain rule).

An **edge** ``writer -> reader`` exists when the writer comes before the reader: a layer-``l``
head input reads the embedding and every head and MLP of the layers before ``l``; ``MLP{l}``
also reads its own layer's heads (not where attention and MLP run side by side, as in GPT-NeoX);
the readout reads everything. This is TransformerLens'
``enumerate_edges`` graph with its positions summed (each edge here is one writer feeding one
reader at every position). With ``kv_source="embed"`` every layer's keys and values read the
layer-0 input, so the only edges into a ``.k`` or ``.v`` reader come from ``"embed"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pe_interp.models.protocol import KVLayout
from probes.common.options import KV_VIEWS

COMPONENTS = ("q", "k", "v")
_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_READER = re.compile(r"^L(\d+)H(\d+)\.([qkv])$")
_KV = re.compile(r"^L(\d+)KV(\d+)$")
_KV_READER = re.compile(r"^L(\d+)KV(\d+)\.([kv])$")
_MLP = re.compile(r"^MLP(\d+)$")


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def kv_name(layer: int, kv: int) -> str:
    """A key/value head of a grouped model, ``"L{layer}KV{kv}"``."""
    return f"L{layer}KV{kv}"


@dataclass(frozen=True)
class Site:
    """A parsed node name: ``kind`` is ``embed``, ``head``, ``mlp``, ``input`` (a head's q/k/v
    input, or a key/value head's k/v input), ``kv`` (a key/value head of a grouped model,
    ``"L1KV0"``, which the circuit views draw as a node) or ``logits``.

    A grouped model's ``"L1KV0.k"`` has ``head`` None (it belongs to no one query head: every head
    of its group reads it) and ``kv`` 0; a per-head reader has ``kv`` None."""

    kind: str
    layer: int | None = None
    head: int | None = None
    component: str | None = None
    kv: int | None = None

    @property
    def head_node(self) -> str | None:
        """The query head a ``head`` or ``input`` site belongs to (``"L1H3"``); None for a key/value
        head's reader."""
        return None if self.head is None else head_name(self.layer, self.head)

    @property
    def node(self) -> str | None:
        """The node a reader or head belongs to: ``"L1H3"``, or ``"L1KV0"`` for a key/value head's
        reader; None for the embedding, an MLP and the readout."""
        if self.kv is not None:
            return kv_name(self.layer, self.kv)
        return self.head_node


def parse(name: str) -> Site:
    """The :class:`Site` of a writer or reader name (ValueError for anything else)."""
    if name == "embed":
        return Site("embed")
    if name == "logits":
        return Site("logits")
    if m := _HEAD.match(name):
        return Site("head", int(m[1]), int(m[2]))
    if m := _READER.match(name):
        return Site("input", int(m[1]), int(m[2]), m[3])
    if m := _KV_READER.match(name):
        return Site("input", int(m[1]), None, m[3], int(m[2]))
    if m := _KV.match(name):
        return Site("kv", int(m[1]), kv=int(m[2]))
    if m := _MLP.match(name):
        return Site("mlp", int(m[1]))
    raise ValueError(
        f"unknown node {name!r}; expected 'embed', 'L<l>H<h>', 'L<l>H<h>.q|k|v', 'L<l>KV<g>.k|v', "
        "'MLP<l>' or 'logits'"
    )


def node_layer(name: str, n_layers: int) -> float:
    """Where a node sits in depth: embed -1, a head (or its input) its layer, an MLP its layer
    plus 0.5, the readout ``n_layers``."""
    s = parse(name)
    if s.kind == "embed":
        return -1.0
    if s.kind == "logits":
        return float(n_layers)
    return s.layer + (0.5 if s.kind == "mlp" else 0.0)


@dataclass(frozen=True, eq=False)
class Graph:
    """The writers, readers and edge mask ``valid[reader, writer]`` of one model."""

    writers: tuple[str, ...]
    readers: tuple[str, ...]
    valid: np.ndarray  # [n_readers, n_writers] bool
    n_layers: int
    n_heads: int
    has_mlp: bool
    kv_embed: bool
    # where the model's hooks read a node (a TransformerLens bridge names them otherwise, and runs
    # a block's attention and MLP side by side in GPT-NeoX: then MLP{l} reads no layer-l head)
    embed_hook: str = "hook_embed"
    mlp_in_hook: str = "hook_mlp_in"  # blocks.{l}.<this>: the MLP's own copy of its input
    # blocks.{l}.<this>: an MLP's writer term (inside the norm after the MLP, where there is one)
    mlp_out_hook: str = "hook_mlp_out"
    parallel: bool = False
    n_kv_heads: int | None = None  # None: one key/value head per query head
    kv_view: str = "grouped"  # "ungrouped": a k and a v reader per query head, grouped or not

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(self.n_heads, self.n_kv_heads or self.n_heads)

    @property
    def grouped(self) -> bool:
        """Whether query heads share key/value heads."""
        return self.kv_layout.grouped

    @property
    def shared_kv(self) -> bool:
        """Whether the k and v readers are one per key/value head, ``"L{l}KV{g}.k|v"`` (grouped
        key/value heads in the grouped view)."""
        return self.grouped and self.kv_view == "grouped"

    @property
    def kv_split(self) -> int:
        """The copies of each forward the readers need: under the ungrouped view of grouped
        key/value heads one per query head of a group (each carries what its query head reads of
        the key/value head), else 1."""
        return self.kv_layout.group if self.grouped and self.kv_view == "ungrouped" else 1

    def reader_of(self, layer: int, head: int, component: str) -> str:
        """The reader whose fork query head ``head`` of ``layer`` reads as its ``component`` input
        (:func:`reader_of`)."""
        return reader_of(layer, head, component, self)

    def fork_readers(self, layer: int, component: str) -> list[str]:
        """The readers of one q/k/v fork of ``layer``, in the fork's head order: one per query head,
        or (grouped k and v in the grouped view) one per key/value head."""
        if component != "q" and self.shared_kv:
            return [f"{kv_name(layer, g)}.{component}" for g in range(self.kv_layout.n_kv_heads)]
        return [f"{head_name(layer, h)}.{component}" for h in range(self.n_heads)]

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def writer_index(self, name: str) -> int:
        try:
            return self.writers.index(name)
        except ValueError:
            raise ValueError(
                f"{name!r} is not a writer of this model ({len(self.writers)} writers)"
            ) from None

    def reader_index(self, name: str) -> int:
        try:
            return self.readers.index(name)
        except ValueError:
            raise ValueError(
                f"{name!r} is not a reader of this model ({len(self.readers)} readers)"
            ) from None

    def edges(self) -> list[tuple[str, str]]:
        """Every ``(writer, reader)`` edge, readers in graph order."""
        r, w = np.nonzero(self.valid)
        return [(self.writers[j], self.readers[i]) for i, j in zip(r, w)]

    def check_edge(self, writer: str, reader: str) -> None:
        if not self.valid[self.reader_index(reader), self.writer_index(writer)]:
            why = (
                " (kv_source='embed': keys and values read the layer-0 input)"
                if self.kv_embed
                else ""
            )
            raise ValueError(f"no edge {writer} -> {reader} in this model{why}")


def reader_of(layer: int, head: int, component: str, graph: Graph) -> str:
    """The name of the reader that query head ``head`` of ``layer`` reads as its ``component``
    (``"q"``, ``"k"``, ``"v"``) input: ``"L{l}H{h}.c"``, or, for k and v of a grouped model, its
    key/value head's ``"L{l}KV{g}.c"`` (shared with the rest of its group; not in the ungrouped
    view)."""
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {', '.join(COMPONENTS)}; got {component!r}")
    if component != "q" and graph.shared_kv:
        return f"{kv_name(layer, graph.kv_layout.kv_head(head))}.{component}"
    return f"{head_name(layer, head)}.{component}"


def kv_heads_of(cfg) -> int | None:
    """The key/value heads of a model config where fewer than its query heads (a bridge's
    ``n_kv_heads``; our own model has one per query head): None where ungrouped."""
    n = cfg.n_kv_heads
    if int(n) == cfg.n_heads:
        return None
    return KVLayout(cfg.n_heads, int(n)).n_kv_heads  # raises where they do not share evenly


def check_kv_view(kv_view: str, who: str) -> None:
    if kv_view not in KV_VIEWS:
        raise ValueError(
            f"{who}: kv_view must be one of {', '.join(map(repr, KV_VIEWS))}; got {kv_view!r}"
        )


def build_graph(cfg, kv_view: str = "grouped") -> Graph:
    """The :class:`Graph` of a model with config ``cfg`` (grouped where ``cfg.n_kv_heads`` is below
    ``cfg.n_heads``; ``kv_view="ungrouped"``: k/v readers per query head all the same)."""
    check_kv_view(kv_view, "build_graph")
    L, H = cfg.n_layers, cfg.n_heads
    n_kv = kv_heads_of(cfg)
    has_mlp = bool(cfg.d_mlp)
    kv_embed = cfg.kv_source == "embed"
    parallel = bool(cfg.parallel_attn_mlp)
    writers = ["embed"]
    for layer in range(L):
        writers += [head_name(layer, h) for h in range(H)]
        if has_mlp:
            writers.append(f"MLP{layer}")
    readers: list[str] = []
    for layer in range(L):
        if n_kv is None or kv_view == "ungrouped":
            readers += [f"{head_name(layer, h)}.{c}" for c in COMPONENTS for h in range(H)]
        else:
            readers += [f"{head_name(layer, h)}.q" for h in range(H)]
            readers += [f"{kv_name(layer, g)}.{c}" for c in "kv" for g in range(n_kv)]
        if has_mlp:
            readers.append(f"MLP{layer}")
    readers.append("logits")
    valid = np.zeros((len(readers), len(writers)), dtype=bool)
    depth = np.array([node_layer(w, L) for w in writers])
    for i, r in enumerate(readers):
        s = parse(r)
        if s.kind == "logits":
            valid[i] = True
        elif (
            s.kind == "mlp"
        ):  # the embed, heads of layers <= l (< l side by side), MLPs of layers < l
            valid[i] = depth < s.layer if parallel else depth <= s.layer
        elif kv_embed and s.component in ("k", "v"):
            valid[i, 0] = True
        else:
            valid[i] = depth < s.layer
    return Graph(
        tuple(writers),
        tuple(readers),
        valid,
        L,
        H,
        has_mlp,
        kv_embed,
        parallel=parallel,
        n_kv_heads=n_kv,
        embed_hook=cfg.embed_hook,
        mlp_in_hook=cfg.mlp_in_hook,
        mlp_out_hook=cfg.mlp_out_hook,
        kv_view=kv_view,
    )


def build_graph_from(scores) -> Graph:
    """The :class:`Graph` an edge attribution scored: its writers and readers, an edge wherever
    it has a score (``scores.scores``, NaN where there is no edge), in its ``meta["kv_view"]``."""
    valid = ~np.isnan(np.asarray(scores.scores, dtype=np.float64))
    kv = [i for i, r in enumerate(scores.readers) if parse(r).component in ("k", "v")]
    kv_embed = bool(kv) and not valid[kv, 1:].any() and scores.n_layers > 1
    has_mlp = any(parse(w).kind == "mlp" for w in scores.writers)
    n_kv = sum(1 for r in scores.readers if r.startswith("L0KV") and r.endswith(".k"))
    return Graph(
        tuple(scores.writers),
        tuple(scores.readers),
        valid,
        scores.n_layers,
        scores.n_heads,
        has_mlp,
        kv_embed,
        n_kv_heads=n_kv or None,
        kv_view=scores.meta.get("kv_view", "grouped"),
    )


__all__ = [
    "COMPONENTS",
    "Graph",
    "Site",
    "build_graph",
    "build_graph_from",
    "check_kv_view",
    "head_name",
    "kv_heads_of",
    "kv_name",
    "node_layer",
    "parse",
    "reader_of",
]

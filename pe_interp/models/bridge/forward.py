"""What a bridge's forward runs (issue 47, item 6; ``benchmarks/smollm2.py``): no more than
:class:`pe_interp.models.bridge.model.BridgedModel` reads of it.

- A restart at layer ``l``: the bridge's ``start_at_layer`` alone still runs blocks ``0..l-1``
  (their output is discarded when block ``l`` swaps the residual in); :func:`skipping_blocks`
  passes them by, so the restart costs ``(L - l) / L`` of a forward.
- The unembedding: a forward that returns class logits reads one position per row, each row's
  last real token; Hugging Face's ``logits_to_keep`` (:func:`read_positions`) unembeds that one
  only, unless a hook reads the unembedding (:func:`may_keep`). Unembedding every position is
  ~20% of SmolLM2's forward (a vocabulary of 49,152 against d_model 576).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from pe_interp.models.protocol import PostNorm

__all__ = [
    "RESUME_TOLERANCE",
    "check_hooks_from",
    "check_edges",
    "check_resume",
    "cached",
    "keeps_logits",
    "layer_of",
    "may_keep",
    "mlp_hooks",
    "post_norm_of",
    "read_positions",
    "resumes_exactly",
    "skipping_blocks",
    "why_no_edges",
]

# a restart that reproduces the forward within this (relative to the logits' scale) is exact: float
# rounding of the same operations in another order stays orders of magnitude below it
RESUME_TOLERANCE = 1e-4


def keeps_logits(hf_model: Any) -> bool:
    """Whether the Hugging Face model's forward takes ``logits_to_keep``."""
    return "logits_to_keep" in inspect.signature(hf_model.forward).parameters


def may_keep(names: Iterable[Any]) -> bool:
    """Whether a forward with hooks on ``names`` may unembed only the read position: no hook is the
    unembedding's (and none is a name filter, which might match it)."""
    return all(isinstance(n, str) and not n.startswith("unembed") for n in names)


def read_positions(mask: Tensor | None, device: Any) -> int | Tensor:
    """``logits_to_keep`` for each row's last real position (right padding): ``[batch, 1]``, or
    1 (the last position) without pads."""
    return 1 if mask is None else (mask.sum(1) - 1)[:, None].to(device)


def layer_of(name: str) -> int | None:
    """The block a hook name is in (``blocks.{l}.``), None outside the blocks."""
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else None


def check_hooks_from(fwd_hooks: Iterable[tuple[Any, Any]], layer: int) -> None:
    """One-line ValueError where a hook is on a block before ``layer``, which a restart there
    does not run (:func:`skipping_blocks`): it would never fire."""
    early = sorted(
        n
        for n, _ in fwd_hooks
        if isinstance(n, str) and (at := layer_of(n)) is not None and at < layer
    )
    if early:
        raise ValueError(
            f"resume at layer {layer} runs no earlier block; hooks on {', '.join(early)} would never fire"
        )


def _pass_through(*args: Any, **kwargs: Any) -> Any:
    """A block's forward that returns its input: Hugging Face's decoder loops (GPT-2, GPT-NeoX,
    Llama) read a block's output as the next hidden states."""
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def skipping_blocks(bridge: Any, layer: int) -> Iterator[None]:
    """Blocks ``0..layer-1`` of ``bridge`` pass their input through, unrun, within the context.

    The bridge's own ``start_at_layer`` runs them and discards their output when block ``layer``
    swaps the caller's residual in; passing them by gives the same forward at ``(L - layer) / L``
    of its cost. The override is set on the bridge's block itself (``object.__setattr__``: the
    bridge's ``__setattr__`` would forward it to the wrapped Hugging Face layer) and removed on
    exit; forward pre-hooks of a skipped block still fire, its own hooks do not."""
    blocks = list(bridge.blocks)[:layer]
    try:
        for block in blocks:
            object.__setattr__(block, "forward", _pass_through)
        yield
    finally:
        for block in blocks:
            block.__dict__.pop("forward", None)


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> resumes_exactly


def resumes_exactly(bridge: Any, d_vocab: int, n_tokens: int = 7) -> bool:
    """:func:`check_resume`, once per bridge (every wrapper of one bridge reads the same answer)."""
    if bridge not in _CHECKED:
        _CHECKED[bridge] = check_resume(bridge, d_vocab, n_tokens)
    return _CHECKED[bridge]


def check_resume(bridge: Any, d_vocab: int, n_tokens: int = 7) -> bool:
    """Whether the bridge restarted at a layer's input (``start_at_layer``, the earlier blocks
    passed by) reproduces its own forward: checked once on ``n_tokens`` tokens at layers 1, the
    middle one and the last, from the inputs its own forward cached there. Read from the bridge,
    not from its model type: BLOOM's bridge, which drops ALiBi when it starts inside the model
    (and whose decoder loop reads a block's output as a tuple, which a passed-by block is not),
    fails it, and the probes then run whole forwards (exact, slower)."""
    n_layers = len(bridge.blocks)
    layers = sorted({min(1, n_layers - 1), n_layers // 2, n_layers - 1})
    g = torch.Generator().manual_seed(0)
    device = next(bridge.parameters()).device
    tokens = torch.randint(0, d_vocab, (1, n_tokens), generator=g).to(device)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in layers]
    with torch.no_grad():
        full, cache = bridge.run_with_cache(tokens, names_filter=names)
        scale = float(full.abs().max()) or 1.0
        for layer, name in zip(layers, names):
            try:
                with skipping_blocks(bridge, layer):
                    again = bridge(cache[name], start_at_layer=layer)
            except (RuntimeError, IndexError, TypeError, ValueError):  # BLOOM: a tuple expected
                return False
            if again.shape != full.shape or not bool(
                ((again - full).abs() <= RESUME_TOLERANCE * scale).all()
            ):
                return False
    return True


def cached(bridge: Any, tokens: Tensor, names: list[str]) -> tuple[dict[str, Tensor], str | None]:
    """The hooks ``names`` of one no-grad forward of ``tokens``, and the first that did not fire
    (None: all did)."""
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens, names_filter=names)
    got = cache.cache_dict if hasattr(cache, "cache_dict") else cache
    return got, next((n for n in names if n not in got), None)


_EDGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> why_no_edges


def why_no_edges(bridge: Any, d_vocab: int, n_tokens: int = 7) -> str | None:
    """:func:`check_edges`, once per bridge."""
    if bridge not in _EDGES:
        _EDGES[bridge] = check_edges(bridge, d_vocab, n_tokens)
    return _EDGES[bridge]


POST_NORMS = {"attn": "ln1_post", "mlp": "ln2_post"}  # branch -> the block's norm after it


def post_norm_of(bridge: Any, layer: int, branch: str) -> PostNorm | None:
    """The norm block ``layer`` of a bridge applies to its ``branch``'s (``"attn"``, ``"mlp"``)
    output before the residual adds it (Gemma 2 and 3, OLMo 2: ``ln1_post``, ``ln2_post``): the
    Hugging Face module itself, called as the model calls it and firing no hook; None where the
    block adds the output as it is."""
    name = POST_NORMS[branch]
    sub = (getattr(bridge.blocks[layer], "submodules", None) or {}).get(name)
    norm = None if sub is None else getattr(sub, "original_component", None)
    return None if norm is None else PostNorm(f"blocks.{layer}.{name}.hook_in", norm)


def mlp_hooks(bridge: Any) -> tuple[str, str]:
    """Where the circuit probes read an MLP's own input and its writer term in block ``l``
    (``blocks.{l}.<hook>``): ln2's input, or the MLP's where no norm comes before it (OLMo 2); the
    MLP's output inside its post-MLP norm (``ln2_post.hook_in``) where one follows it, else
    ``hook_mlp_out``."""
    subs = getattr(bridge.blocks[0], "submodules", None) or {}
    return (
        "ln2.hook_in" if "ln2" in subs or "mlp" not in subs else "mlp.hook_in",
        "ln2_post.hook_in" if "ln2_post" in subs else "hook_mlp_out",
    )


def check_edges(bridge: Any, d_vocab: int, n_tokens: int = 7) -> str | None:
    """Why the edge probes (attribution, path patching, circuits) cannot run on the bridge, in one
    line; None where they can. They add a writer's residual term to one head's q/k/v input, so:

    - each block writes ``sum_h z_h W_O[h] + b_O`` (``hook_attn_out``) plus ``hook_mlp_out`` to
      the residual, so a head's term is its own; or, where a norm follows the attention (Gemma 2
      and 3, OLMo 2), that norm of the sum, so a head's term is its own inside the norm, which
      the probes recompute (:mod:`probes.circuits.post_norm`); the same for a norm after the MLP;
    - the per-head forks (TransformerLens' ``use_split_qkv_input``) come before the layer norm:
      every layer's ``hook_q_input``/``hook_k_input``/``hook_v_input`` holds the layer's input
      (``hook_resid_pre``) in every head, and a term added to head 0's ``hook_q_input`` (and
      ``hook_k_input``) of layer 0 moves that head's ``hook_q`` (``hook_k``) and no other head's
      (BLOOM's bridge forks after the norm, TransformerLens #1317);
    - under grouped key/value heads the k/v forks carry one head per key/value head (the config's
      ``n_key_value_heads``, dividing the query heads), as the edge graph's k/v readers do.

    Read from the bridge on ``n_tokens`` tokens (three forwards), not from its model type."""
    g = torch.Generator().manual_seed(0)
    device = next(bridge.parameters()).device
    tokens = torch.randint(0, d_vocab, (1, n_tokens), generator=g).to(device)
    n_layers = len(bridge.blocks)
    kinds = ("hook_resid_pre", "hook_resid_post", "attn.hook_z", "hook_attn_out", "hook_mlp_out")
    writes = [f"blocks.{i}.{k}" for i in range(n_layers) for k in (*kinds, *mlp_hooks(bridge))]
    got, missing = cached(bridge, tokens, list(dict.fromkeys(writes)))
    if missing is not None:
        return f"the bridge fires no {missing}, where a writer's residual term is read"
    for i in range(n_layers):
        why = _why_not_writes(bridge, got, i)
        if why is not None:
            return why
    return _why_not_forks(bridge, tokens)


def _why_not_writes(bridge: Any, got: dict[str, Tensor], i: int) -> str | None:
    """The writers' half of :func:`check_edges`, for layer ``i``."""
    attn = bridge.blocks[i].attn
    z, out = got[f"blocks.{i}.attn.hook_z"], got[f"blocks.{i}.hook_attn_out"]
    b_o = getattr(attn, "b_O", None)
    heads = torch.einsum("bphd,hdm->bpm", z, attn.W_O) + (0 if b_o is None else b_o)
    norm = post_norm_of(bridge, i, "attn")
    with torch.no_grad():
        heads = heads if norm is None else norm.norm(heads)
    tol = RESUME_TOLERANCE * (float(out.abs().max()) or 1.0)
    if not bool(((heads - out).abs() <= tol).all()):
        return (
            f"layer {i}'s attention output is not the sum of its heads' z_h W_O[h] (a norm "
            "after the attention), so a head's residual term is not its own"
            if norm is None
            else f"layer {i}'s attention output is not its post-attention norm of the sum of its "
            "heads' z_h W_O[h], so a head's term inside that norm is not its own"
        )
    mlp = post_norm_of(bridge, i, "mlp")
    mlp_out = got[f"blocks.{i}.hook_mlp_out"]
    if mlp is not None:
        with torch.no_grad():
            raw = mlp.norm(got[f"blocks.{i}.{mlp_hooks(bridge)[1]}"])
        if not bool(
            ((raw - mlp_out).abs() <= RESUME_TOLERANCE * (float(mlp_out.abs().max()) or 1.0)).all()
        ):
            return f"layer {i}'s MLP output is not its post-MLP norm of the MLP's own output"
    pre, post = got[f"blocks.{i}.hook_resid_pre"], got[f"blocks.{i}.hook_resid_post"]
    step = post - pre
    # each entry at its own scale: where the residual is large (SmolLM2's massive activations)
    # the difference of two of them keeps float32 rounding of their size, elsewhere not
    tol = RESUME_TOLERANCE * (pre.abs() + post.abs() + float(step.abs().max()))
    if not bool(((out + mlp_out - step).abs() <= tol).all()):
        return f"layer {i} writes more to the residual than hook_attn_out plus hook_mlp_out"
    return None


AFTER_NORM = (
    "the bridge forks each head's q/k/v input after the layer norm (TransformerLens #1317), where "
    "a writer's residual term cannot be added to one head"
)


def _why_not_forks(bridge: Any, tokens: Tensor) -> str | None:
    """The forks' half of :func:`check_edges`."""
    g = torch.Generator().manual_seed(1)
    device = tokens.device
    n_layers = len(bridge.blocks)
    inputs = [f"blocks.{i}.attn.hook_{t}_input" for i in range(n_layers) for t in "qkv"]
    names = (
        inputs + [f"blocks.{i}.hook_resid_pre" for i in range(n_layers)] + ["blocks.0.attn.hook_q"]
    )
    was = bool(getattr(bridge.cfg, "use_split_qkv_input", False))
    attn_in = bool(getattr(bridge.cfg, "use_attn_in", False))  # exclusive with the forks
    try:
        if attn_in:
            bridge.set_use_attn_in(False)
        try:
            bridge.set_use_split_qkv_input(True)
        except NotImplementedError as e:  # the bridge's attention has no per-head forks
            said = str(e).split(". ")[0].splitlines()[0]
            return f"the bridge has no per-head q/k/v input forks for its attention ({said})"
        with torch.no_grad():
            got, missing = cached(bridge, tokens, names)
            if missing is not None:
                return f"the bridge fires no {missing} with its per-head forks on"
            for name in inputs:
                x, resid = got[name], got[f"blocks.{layer_of(name)}.hook_resid_pre"]
                if x.dim() != 4 or x.shape[:2] != resid.shape[:2]:
                    return f"{name} is not [batch, pos, head, d_model]"
                tol = RESUME_TOLERANCE * (float(resid.abs().max()) or 1.0)
                if not bool(((x - resid[:, :, None]).abs() <= tol).all()):
                    return AFTER_NORM
            n_q, n_kv = got[inputs[0]].shape[2], got[inputs[1]].shape[2]
            # grouped key/value heads: the k/v forks are one per key/value head, and so are the
            # edge graph's k and v readers (probes.circuits.graph)
            if got[inputs[2]].shape[2] != n_kv or n_kv < 1 or n_q % n_kv:
                return (
                    f"its {n_q} query heads do not share its key/value forks' heads "
                    f"({n_kv} k, {got[inputs[2]].shape[2]} v) evenly"
                )
            n_cfg = getattr(bridge.cfg, "n_key_value_heads", None) or n_q
            if n_kv != n_cfg:
                return (
                    f"its k/v forks carry {n_kv} heads where its config has {n_cfg} key/value heads"
                )
            q, k = got["blocks.0.attn.hook_q"], got.get("blocks.0.attn.hook_k")
            if q.dim() != 4 or q.shape[2] != n_q:
                return "blocks.0.attn.hook_q is not [batch, pos, query head, d_head]"
            bump = torch.randn(got[inputs[0]][:, :, 0].shape, generator=g).to(device)

            def add(x: Tensor, hook: Any) -> Tensor:
                x = x.clone()
                x[:, :, 0] += bump
                return x

            moved: dict[str, Tensor] = {}
            bridge.run_with_hooks(
                tokens,
                fwd_hooks=[
                    (inputs[0], add),
                    (inputs[1], add),
                    ("blocks.0.attn.hook_q", lambda x, hook: moved.__setitem__("q", x)),
                    ("blocks.0.attn.hook_k", lambda x, hook: moved.__setitem__("k", x)),
                ],
            )
    finally:
        bridge.set_use_split_qkv_input(was)
        if attn_in:
            bridge.set_use_attn_in(True)
    for what, before in (("query", q), ("key", k)):
        if what == "key" and (before is None or "k" not in moved):
            continue  # a bridge without hook_k: the q check stands for the forks
        if before.dim() != 4 or before.shape != moved[what[0]].shape:
            return f"blocks.0.attn.hook_{what[0]} is not [batch, pos, head, d_head]"
        change = (moved[what[0]] - before).abs().amax(dim=(0, 1, 3))  # per head
        tol = RESUME_TOLERANCE * (float(before.abs().max()) or 1.0)
        if not (bool(change[0] > tol) and bool((change[1:] <= tol).all())):
            return (
                f"a term added to one head's hook_{what[0]}_input does not move that head's "
                f"{what} alone"
            )
    return None

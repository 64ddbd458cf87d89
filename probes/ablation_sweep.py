"""The machinery of head ablation sweeps (:func:`probes.ablation.ablate_heads` is the entry point):
knock out one attention head (or a set of heads) at a time and measure
how much a metric suffers: the measurement behind the paper's "single-head deposit pattern"
(paper digest §6).

Three ways to remove a head, all acting on its output ``blocks.{l}.attn.hook_z``
(``[batch, pos, head, d_head]``, before ``W_O``):

- ``zero``: ``z_h = 0``. This is exactly the authors' protocol of zeroing the head's rows of the
  value projection and its value bias (``W_V[h] = 0, b_V[h] = 0`` makes ``v_h = 0``, so
  ``z_h = pattern @ v_h = 0``); the head then contributes only ``b_O`` (which it shares).
- ``mean``: ``z_h`` at position ``p`` is replaced by its mean at ``p`` over the real (non-pad)
  tokens of a reference set (the evaluated examples by default); see :func:`head_means`.
- ``resample``: ``z_h`` of example ``i`` is replaced by ``z_h`` of another example (position by
  position) from the reference set, taken from that example's clean forward. With the default
  reference (the evaluated set) the source of example ``i`` is a seeded random cyclic derangement
  of the examples, so no example is its own source; with an explicit reference each example
  draws a source uniformly (seeded). The same sources serve every head, so head-to-head
  differences are not sampling noise of the sources. Positions where the source is shorter
  than the target take the source's values at its pad positions; for length-sensitive tasks
  pass a reference of matched lengths (e.g. counterfactual pairs).

How the sweep is fast without approximating anything:

1. Examples are processed in chunks; each chunk's clean forward caches
   ``blocks.{l}.hook_resid_pre``, ``hook_resid_mid`` and ``attn.hook_z`` for the layers where
   ablations start.
2. An ablation whose earliest head is in layer ``l`` restarts the forward at layer ``l`` from
   that cache (``model(..., start_at_layer=l, residual=...)``), skipping layers ``0..l-1``, which
   an ablation in layer ``l`` cannot change. Layer ``l``'s own attention is not recomputed
   either: its input is the clean one, so the ablated ``hook_resid_mid`` is the cached clean one
   plus ``(replacement - z_h) @ W_O[h]`` for each ablated head ``h``; the forward resumes at that
   block's MLP through the model's own seam (``forward_unchecked(..., start_at="resid_mid")``).
3. Many ablations share one forward: the chunk is repeated ``k`` times along the batch axis and
   each copy removes a different head (set): through its own output change at the start layer,
   and through one hook per later layer on ``hook_z`` (for sets spanning layers) that
   replaces a different head in each copy.
4. When the model masks padding (``cfg.mask_padding``), examples are sorted by length and each
   chunk is cut to its longest real sequence. Right-hand pad columns never influence a real
   token there (pad keys are masked, positions are absolute from 0, every encoding depends on
   position only through ``[:n_pos]`` slices), so this removes work whose result is discarded.

The outcome equals a naive loop (:func:`probes.ablation.ablate_heads_naive`: one full forward per ablation, full
width, a hook writing the head's slice) within float tolerance; ``tests/test_ablation.py`` checks
this for every method and metric, with padding, causal and bidirectional attention and
``kv_source="embed"``. Ablations are always evaluated in ``eval()`` mode (no dropout); the
model's train/eval state is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.hardware import autocast
from pe_interp.io import (
    load_result,
    nan_array,
    register_result,
    to_json,
    write_result,
)
from pe_interp.modes import eval_mode
from probes.inputs import (
    FiniteWatch,
    check_count,
    check_examples,
    check_finite_model,
    check_head,
    check_layer,
    check_layers,
)
from probes.metrics import (
    Metric,
    harm,
    paired_bootstrap,
    resample_sources,
    resolve_metric,
)

Head = tuple[int, int]
METHODS = ("zero", "mean", "resample")


# ------------------------------------------------------------------------------------------------
# Result
# ------------------------------------------------------------------------------------------------
RESULT_KIND = register_result("ablation", "AblationResult.load", ("baseline", "values", "drops", "method", "metric", "n_layers", "n_heads"))


@dataclass(frozen=True, eq=False)
class AblationResult:
    """The outcome of :func:`probes.ablation.ablate_heads`.

    For a grid sweep (``head_sets is None``) the arrays are ``[n_layers, n_heads]``: entry
    ``[l, h]`` is the metric with head ``h`` of layer ``l`` ablated, NaN where not computed. For
    a set sweep they are ``[n_sets]``, one entry per ``head_sets[i]``.

    ``drops`` is the *harm* of each ablation, signed so that **positive always means the
    ablation hurt**: ``baseline - values`` for higher-is-better metrics (accuracy, true-class
    logit) and ``values - baseline`` for lower-is-better ones (loss). ``ci_low``/``ci_high``
    bound ``drops`` (paired percentile bootstrap over examples, see
    :func:`probes.metrics.paired_bootstrap`; NaN when ``n_bootstrap == 0``).
    ``per_example`` (``[..., n_examples]``, optional) holds the per-example metric under
    ablation and ``baseline_per_example`` the clean one.
    """

    baseline: float
    values: np.ndarray
    drops: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    method: str
    metric: str
    higher_is_better: bool
    n_examples: int
    n_layers: int
    n_heads: int
    head_sets: tuple[tuple[Head, ...], ...] | None = None
    per_example: np.ndarray | None = None
    baseline_per_example: np.ndarray | None = None
    n_bootstrap: int = 0
    ci: float = 0.95
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_grid(self) -> bool:
        return self.head_sets is None

    @property
    def computed(self) -> np.ndarray:
        """Boolean mask of the entries that were computed."""
        return ~np.isnan(self.values)

    def layer(self, layer: int) -> np.ndarray:
        """The drops of one layer's heads (grid sweeps only)."""
        self._need_grid()
        return self.drops[check_layer(self.n_layers, layer, "AblationResult")]

    def top_head(self, layer: int) -> int:
        """The head whose ablation hurts most in ``layer`` (grid sweeps only)."""
        d = self.layer(layer)
        if np.isnan(d).all():
            raise ValueError(f"layer {layer} was not swept")
        return int(np.nanargmax(d))

    def _need_grid(self) -> None:
        if not self.is_grid:
            raise ValueError("this AblationResult holds head sets, not a layers x heads grid")

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self, per_example: bool = True) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes null). ``per_example=False`` leaves out the per-example
        arrays, which can be large."""
        return {
            "baseline": self.baseline,
            "values": to_json(self.values),
            "drops": to_json(self.drops),
            "ci_low": to_json(self.ci_low),
            "ci_high": to_json(self.ci_high),
            "method": self.method,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "n_examples": self.n_examples,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "head_sets": None if self.head_sets is None else [[list(h) for h in s] for s in self.head_sets],
            "per_example": to_json(self.per_example) if per_example else None,
            "baseline_per_example": to_json(self.baseline_per_example) if per_example else None,
            "n_bootstrap": self.n_bootstrap,
            "ci": self.ci,
            "seed": self.seed,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AblationResult:
        sets = d.get("head_sets")
        return cls(
            baseline=float(d["baseline"]),
            values=nan_array(d["values"]),
            drops=nan_array(d["drops"]),
            ci_low=nan_array(d["ci_low"]),
            ci_high=nan_array(d["ci_high"]),
            method=d["method"],
            metric=d["metric"],
            higher_is_better=bool(d["higher_is_better"]),
            n_examples=int(d["n_examples"]),
            n_layers=int(d["n_layers"]),
            n_heads=int(d["n_heads"]),
            head_sets=None if sets is None else tuple(tuple((int(a), int(b)) for a, b in s) for s in sets),
            per_example=nan_array(d.get("per_example")),
            baseline_per_example=nan_array(d.get("baseline_per_example")),
            n_bootstrap=int(d.get("n_bootstrap", 0)),
            ci=float(d.get("ci", 0.95)),
            seed=int(d.get("seed", 0)),
            meta=dict(d.get("meta", {})),
        )

    def save(self, path: str | Path, per_example: bool = False) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(per_example=per_example), indent=1, sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> AblationResult:
        return load_result(path, RESULT_KIND, cls.from_dict)


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def keep_only(model_or_n_heads: Any, layer: int, head: int) -> frozenset[Head]:
    """The head set that ablates every head of ``layer`` except ``head`` ("keep only one").

    Ablating it measures how much of the layer's contribution ``head`` carries alone.
    ``model_or_n_heads`` is a model (its ``cfg.n_heads`` is used) or the number of heads."""
    n_heads = model_or_n_heads if isinstance(model_or_n_heads, int) else model_or_n_heads.cfg.n_heads
    check_head(n_heads, head, "keep_only")
    if not isinstance(model_or_n_heads, int):
        check_layer(model_or_n_heads, layer, "keep_only")
    return frozenset((layer, h) for h in range(n_heads) if h != head)


def _as_inputs(ref: Any) -> tuple[Tensor, Tensor | None]:
    if isinstance(ref, Tensor):
        return ref, None
    if isinstance(ref, tuple | list) and len(ref) == 2:
        return ref[0], ref[1]
    if hasattr(ref, "tokens"):
        return ref.tokens, getattr(ref, "pad_mask", None)
    raise ValueError("reference must be a token tensor, a (tokens, pad_mask) pair or a Batch")


def _prepare(model, tokens: Tensor, pad_mask: Tensor | None, what: str = "tokens", who: str = "") -> tuple[Tensor, Tensor]:
    mask = "pad_mask" if what == "tokens" else f"the {what}'s pad_mask"
    tokens, _, pad_mask = check_examples(model, tokens, None, pad_mask, who=who, what=what, mask_name=mask)
    return tokens, pad_mask


def _checked(model, tokens, labels, pad_mask, n_bootstrap, reference, who: str) -> tuple[Tensor, Tensor, Tensor]:
    """The checks of a sweep, before any work: finite weights, the examples, the reference, the
    bootstrap count."""
    check_finite_model(model, who)
    check_count(n_bootstrap, "n_bootstrap", 0, who)
    tokens, labels, pad_mask = check_examples(model, tokens, labels, pad_mask, who=who)
    if tokens.shape[0] == 0:
        raise ValueError(f"{who}: no examples to evaluate")
    if reference is not None:
        _prepare(model, *_as_inputs(reference), "reference", who)
    return tokens, labels, pad_mask


def _needed_width(model, pad_mask: Tensor) -> Tensor:
    """Columns each row needs: through its last real token when pads are masked, else all."""
    n = pad_mask.shape[1]
    if not model.cfg.mask_padding:
        return torch.full((pad_mask.shape[0],), n, dtype=torch.long, device=pad_mask.device)
    last = n - 1 - pad_mask.flip(1).to(torch.int8).argmax(1)
    return last + 1


def _weights(model, pad_mask: Tensor) -> Tensor:
    """Which positions count as tokens the model sees (all of them when padding is unmasked)."""
    return pad_mask if model.cfg.mask_padding else torch.ones_like(pad_mask)


def head_means(
    model,
    tokens: Tensor,
    pad_mask: Tensor | None = None,
    *,
    layers: Iterable[int] | None = None,
    width: int | None = None,
    batch_size: int | None = None,
) -> dict[int, Tensor]:
    """Mean of ``blocks.{l}.attn.hook_z`` per position over the real tokens of ``tokens``.

    Returns ``{layer: [width, n_heads, d_head]}`` (``width`` defaults to the padded length of
    ``tokens``). Position ``p`` averages the examples whose position ``p`` is a real token;
    positions that are real in no example (beyond the reference's lengths) get the mean over
    all real tokens of all positions. With ``cfg.mask_padding=False`` every position counts as
    a token, as the model sees it.
    """
    tokens, pad_mask = _prepare(model, tokens, pad_mask)
    batch_size = default_batch_size(model) if batch_size is None else batch_size
    layers = sorted(set(range(model.cfg.n_layers) if layers is None else check_layers(model, layers, "head_means")))
    if not layers:
        raise ValueError("head_means: layers is empty; pass None for every layer")
    N, W = tokens.shape
    width = W if width is None else width
    H, D = model.cfg.n_heads, model.cfg.d_head
    sums = {layer: torch.zeros(W, H, D, dtype=torch.float64, device=tokens.device) for layer in layers}
    counts = torch.zeros(W, dtype=torch.float64, device=tokens.device)
    weights = _weights(model, pad_mask)
    need = _needed_width(model, pad_mask)
    with eval_mode(model), torch.no_grad():
        for c0 in range(0, N, batch_size):
            sl = slice(c0, c0 + batch_size)
            w = int(need[sl].max())
            wt = weights[sl, :w].to(torch.float64)
            store: dict[int, Tensor] = {}

            def save(z, hook, store=store):
                store[int(hook.name.split(".")[1])] = z
                return None

            hooks = [(f"blocks.{layer}.attn.hook_z", save) for layer in layers]
            model.run_with_hooks(tokens[sl, :w], pad_mask[sl, :w], stop_at_layer=max(layers) + 1, fwd_hooks=hooks)
            counts[:w] += wt.sum(0)
            for layer in layers:
                sums[layer][:w] += torch.einsum("bp,bphd->phd", wt, store[layer].to(torch.float64))
    out = {}
    total = counts.sum().clamp_min(1.0)
    for layer in layers:
        overall = sums[layer].sum(0) / total
        mean = torch.where(counts[:, None, None] > 0, sums[layer] / counts.clamp_min(1.0)[:, None, None], overall)
        if width > W:
            mean = torch.cat([mean, overall.expand(width - W, H, D)])
        out[layer] = mean[:width].to(model.W_E.dtype)
    return out


def _capture_z(model, tokens: Tensor, pad_mask: Tensor, layers: Sequence[int]) -> dict[int, Tensor]:
    store: dict[int, Tensor] = {}

    def save(z, hook):
        store[int(hook.name.split(".")[1])] = z
        return None

    hooks = [(f"blocks.{layer}.attn.hook_z", save) for layer in layers]
    model.run_with_hooks(tokens, pad_mask, stop_at_layer=max(layers) + 1, fwd_hooks=hooks)
    return store


class _Replacement:
    """What replaces an ablated head's ``z``, per chunk of evaluated examples."""

    def __init__(self, model, method, tokens, pad_mask, reference, layers, seed, batch_size):
        self.model, self.method, self.layers = model, method, sorted(layers)
        self.means: dict[int, Tensor] = {}
        if method == "mean":
            rt, rp = (tokens, pad_mask) if reference is None else _as_inputs(reference)
            self.means = head_means(model, rt, rp, layers=self.layers, width=tokens.shape[1], batch_size=batch_size)
        elif method == "resample":
            if reference is None:
                self.ref_tokens, self.ref_pm = tokens, pad_mask
                self.src = resample_sources(tokens.shape[0], None, seed)
            else:
                rt, rp = _as_inputs(reference)
                self.ref_tokens, self.ref_pm = _prepare(model, rt, rp, "reference")
                if self.ref_tokens.shape[1] != tokens.shape[1]:
                    raise ValueError(
                        "resample ablation: the reference must have the padded length of the evaluated "
                        f"tokens ({tokens.shape[1]}), got {self.ref_tokens.shape[1]}"
                    )
                self.src = resample_sources(tokens.shape[0], self.ref_tokens.shape[0], seed)
            self.src = self.src.to(tokens.device)
            self.ref_need = _needed_width(model, self.ref_pm)

    def for_chunk(self, idx: Tensor, width: int) -> dict[int, Tensor | None]:
        """``{layer: None (zero) | [width, H, D] (mean) | [len(idx), width, H, D] (resample)}``."""
        if self.method == "zero":
            return dict.fromkeys(self.layers)
        if self.method == "mean":
            return {layer: self.means[layer][:width] for layer in self.layers}
        src = self.src[idx]
        ws = max(width, int(self.ref_need[src].max()))
        z = _capture_z(self.model, self.ref_tokens[src, :ws], self.ref_pm[src, :ws], self.layers)
        return {layer: z[layer][:, :width] for layer in self.layers}


def default_batch_size(model) -> int:
    """Rows per forward when not given: 128 on CPU, where larger batches fall out of cache and
    run slower per row (measured at the paper's size), 2048 on an accelerator."""
    return 128 if model.W_E.device.type == "cpu" else 2048


def _units(model, layers, heads, head_sets) -> tuple[list[tuple[Head, ...]], bool]:
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def check(layer: int, head: int) -> Head:
        return check_layer(L, layer, "ablate_heads"), check_head(H, head, "ablate_heads")

    if head_sets is not None:
        if layers is not None or heads is not None:
            raise ValueError("pass either head_sets or layers/heads, not both")
        units = []
        for s in head_sets:
            unit = tuple(sorted({check(*lh) for lh in s}))
            if not unit:
                raise ValueError("head_sets: every set needs at least one (layer, head)")
            units.append(unit)
        if not units:
            raise ValueError("head_sets is empty")
        return units, False
    ls = list(range(L)) if layers is None else [check(layer, 0)[0] for layer in layers]
    hs = list(range(H)) if heads is None else [check(0, h)[1] for h in heads]
    if not ls or not hs:
        raise ValueError("nothing to ablate: layers and heads must be non-empty")
    return [((layer, h),) for layer in sorted(set(ls)) for h in sorted(set(hs))], True


def _replace_hook(mask: Tensor, repl: Tensor | None, k: int, B: int) -> Callable:
    """Hook on ``hook_z`` of a batch of ``k`` stacked copies of ``B`` examples: in copy ``j``,
    replace the heads where ``mask[j]`` is True by ``repl`` (zero when None)."""
    sel = mask[:, None, None, :, None]  # [k, 1, 1, H, 1]

    def fn(z: Tensor, hook) -> Tensor:
        zv = z.reshape(k, B, *z.shape[1:])
        if repl is None:
            out = zv.masked_fill(sel, 0.0)
        elif repl.ndim == 3:  # [pos, H, D], same for every example
            out = torch.where(sel, repl.to(z.dtype)[None, None], zv)
        else:  # [B, pos, H, D], per example
            out = torch.where(sel, repl.to(z.dtype)[None], zv)
        return out.reshape(z.shape)

    return fn


# ------------------------------------------------------------------------------------------------
# The sweeps
# ------------------------------------------------------------------------------------------------
def _sweep_batched(model, tokens, labels, pad_mask, units, metric: Metric, repl: _Replacement, batch_size, progress):
    N, W = tokens.shape
    H = model.cfg.n_heads
    need = _needed_width(model, pad_mask)
    order = torch.argsort(need, stable=True) if model.cfg.mask_padding else torch.arange(N, device=tokens.device)
    groups: dict[int, list[int]] = {}
    for u, unit in enumerate(units):
        groups.setdefault(min(layer for layer, _ in unit), []).append(u)
    kmax = max(len(g) for g in groups.values())
    ex_chunk = max(1, min(N, batch_size // kmax))
    base = torch.empty(N, dtype=torch.float64)
    vals = torch.full((len(units), N), float("nan"), dtype=torch.float64)
    starts = sorted(groups)
    chunks = range(0, N, ex_chunk)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=f"ablate ({repl.method})", unit="chunk")
    for c0 in chunks:
        idx = order[c0 : c0 + ex_chunk]
        idx_cpu = idx.cpu()
        B = len(idx)
        w = int(need[idx].max())
        toks, pm, lab = tokens[idx, :w], pad_mask[idx, :w], labels[idx]
        key_valid = model.check_inputs(toks, pm)[1]  # once per chunk; the copies reuse it
        cache: dict[tuple[str, int], Tensor] = {}

        def save(x, hook, cache=cache):
            parts = hook.name.split(".")
            kind = {"hook_resid_mid": "mid", "hook_z": "z"}[parts[-1]]
            cache[(kind, int(parts[1]))] = x
            return None

        names = ("hook_resid_mid", "attn.hook_z")
        logits = model.run_with_hooks(toks, pm, fwd_hooks=[(f"blocks.{s}.{n}", save) for s in starts for n in names])
        base[idx_cpu] = metric(logits, lab).cpu()
        replacement = repl.for_chunk(idx, w)
        for s in starts:
            uids = groups[s]
            k = max(1, min(len(uids), batch_size // B))
            # Layer s's attention is the clean one in every copy except for the ablated heads:
            # each adds its change of output, (replacement - z_h) @ W_O[h].
            z = cache[("z", s)]
            r = replacement[s]
            diff = -z if r is None else (r.to(z.dtype) if r.ndim == 4 else r.to(z.dtype)[None]) - z
            W_O = model.blocks[s].attn.W_O
            for j0 in range(0, len(uids), k):
                part = uids[j0 : j0 + k]
                kk = len(part)
                masks: dict[int, Tensor] = {}
                for j, u in enumerate(part):
                    for layer, h in units[u]:
                        if layer not in masks:
                            masks[layer] = torch.zeros(kk, H, dtype=torch.bool, device=tokens.device)
                        masks[layer][j, h] = True
                hooks = [
                    (f"blocks.{layer}.attn.hook_z", _replace_hook(m, replacement[layer], kk, B))
                    for layer, m in masks.items()
                    if layer != s
                ]
                hp = masks[s].any(0).nonzero()[:, 0]  # heads of layer s ablated in this batch
                sel = masks[s].to(diff.dtype)  # [kk, H]
                if len(hp) <= kk:  # one output change per head, then pick them per copy
                    contrib = torch.einsum("bphd,hdm->hbpm", diff[:, :, hp], W_O[hp])
                    delta = torch.einsum("kh,hbpm->kbpm", sel[:, hp], contrib)
                else:  # many heads per copy (e.g. keep-only sets): mask, then one product
                    delta = torch.einsum("kbphd,hdm->kbpm", diff[None] * sel[:, None, None, :, None], W_O)
                mid = (cache[("mid", s)][None] + delta).reshape(kk * B, w, -1)
                kv = None if key_valid is None else key_valid.repeat(kk, 1)
                with model.hooks(fwd_hooks=hooks):
                    out = model.forward_unchecked(toks.repeat(kk, 1), kv, start_at_layer=s, residual=mid, start_at="resid_mid")
                m = metric(out, lab.repeat(kk)).view(kk, B).cpu()
                vals[torch.tensor(part)[:, None], idx_cpu[None, :]] = m
    return base, vals


def _sweep_naive(model, tokens, labels, pad_mask, units, metric: Metric, repl: _Replacement, batch_size, progress):
    """One full forward (all layers, full padded width) per ablation and batch of examples."""
    N, W = tokens.shape
    base = torch.empty(N, dtype=torch.float64)
    vals = torch.empty((len(units), N), dtype=torch.float64)
    chunks = range(0, N, batch_size)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc="ablate (naive)", unit="chunk")
    for c0 in chunks:
        idx = torch.arange(c0, min(N, c0 + batch_size), device=tokens.device)
        toks, pm, lab = tokens[idx], pad_mask[idx], labels[idx]
        base[idx.cpu()] = metric(model(toks, pm), lab).cpu()
        replacement = repl.for_chunk(idx, W)
        for u, unit in enumerate(units):
            by_layer: dict[int, list[int]] = {}
            for layer, h in unit:
                by_layer.setdefault(layer, []).append(h)

            def make(layer: int, hs: list[int], replacement=replacement):
                r = replacement[layer]

                def fn(z, hook):
                    z = z.clone()
                    for h in hs:
                        if r is None:
                            z[:, :, h] = 0.0
                        elif r.ndim == 3:
                            z[:, :, h] = r[None, :, h].to(z.dtype)
                        else:
                            z[:, :, h] = r[:, :, h].to(z.dtype)
                    return z

                return fn

            hooks = [(f"blocks.{layer}.attn.hook_z", make(layer, hs)) for layer, hs in by_layer.items()]
            vals[u, idx.cpu()] = metric(model.run_with_hooks(toks, pm, fwd_hooks=hooks), lab).cpu()
    return base, vals


def _run(
    sweep,
    model,
    tokens,
    labels,
    *,
    pad_mask,
    method,
    metric,
    layers,
    heads,
    head_sets,
    reference,
    per_example,
    n_bootstrap,
    ci,
    seed,
    batch_size,
    progress,
    higher_is_better,
    amp=False,
) -> AblationResult:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(map(repr, METHODS))}")
    batch_size = default_batch_size(model) if batch_size is None else batch_size
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")
    m = resolve_metric(metric, higher_is_better)
    units, grid = _units(model, layers, heads, head_sets)
    who = "ablate_heads_naive" if sweep is _sweep_naive else "ablate_heads"
    tokens, labels, pad_mask = _checked(model, tokens, labels, pad_mask, n_bootstrap, reference, who)
    N = tokens.shape[0]
    needed_layers = {layer for unit in units for layer, _ in unit}
    watch = FiniteWatch()  # the logits of every forward, checked once at the end
    with eval_mode(model), torch.no_grad(), autocast(tokens.device, amp):
        repl = _Replacement(model, method, tokens, pad_mask, reference, needed_layers, seed, batch_size)
        watched = Metric(m.name, watch.wrap(m.fn), m.higher_is_better)
        base_pe, vals_pe = sweep(model, tokens, labels, pad_mask, units, watched, repl, batch_size, progress)
    watch.check(who, amp)
    base_np = base_pe.numpy()
    vals_np = vals_pe.numpy()
    baseline = float(base_np.mean())
    unit_values = vals_np.mean(axis=1)
    low, high = paired_bootstrap(
        base_np, vals_np, higher_is_better=m.higher_is_better, n_bootstrap=n_bootstrap, ci=ci, seed=seed
    )
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    if grid:
        shape = (L, H)
        pos = [unit[0] for unit in units]

        def place(x: np.ndarray, extra: tuple = ()) -> np.ndarray:
            out = np.full(shape + extra, np.nan)
            for i, (layer, h) in enumerate(pos):
                out[layer, h] = x[i]
            return out

    else:

        def place(x: np.ndarray, extra: tuple = ()) -> np.ndarray:
            return np.asarray(x, dtype=np.float64)

    values = place(unit_values)
    meta = {
        "encoding": cfg.encoding_name,
        "encoding_kind": cfg.encoding_kind,
        "mask_padding": cfg.mask_padding,
        "kv_source": cfg.kv_source,
        "attention_dir": cfg.attention_dir,
        "reference": "evaluated" if reference is None else "given",
    }
    return AblationResult(
        baseline=baseline,
        values=values,
        drops=harm(baseline, values, m.higher_is_better),
        ci_low=place(low),
        ci_high=place(high),
        method=method,
        metric=m.name,
        higher_is_better=m.higher_is_better,
        n_examples=N,
        n_layers=L,
        n_heads=H,
        head_sets=None if grid else tuple(units),
        per_example=place(vals_np, (N,)) if per_example else None,
        baseline_per_example=base_np.copy() if per_example else None,
        n_bootstrap=int(n_bootstrap),
        ci=float(ci),
        seed=int(seed),
        meta=meta,
    )

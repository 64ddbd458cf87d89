"""Batched activation patching with per-example values and bootstrap confidence intervals.

:func:`patch` computes the same numbers as TransformerLens' ``get_act_patch_*`` functions
(``transformer_lens.patching``) on a :class:`~pe_interp.HookedPETransformer`, with the same
output shapes, but much faster:

- the source run (clean, by default) and the receiving run (corrupt) are each cached **once**;
- a patched run **starts at the patched layer** from the receiving run's cached
  ``blocks.{l}.hook_resid_pre`` (``model(..., start_at_layer=l, residual=...)``), so layers before
  the patch are never recomputed. Patches of a head's output (``z``), of ``attn_out`` and of
  ``mlp_out`` start even later: the patched layer's attention (and, for ``mlp_out``, its MLP) is
  not recomputed at all, only ``W_O`` applied to the mixed ``z`` (this is exactly what the layer
  computes from its ``hook_z``);
- many patch cells run in **one forward**: the batch is expanded to ``[cells * examples]`` rows
  and each cell's rows get their own patch, written as one ``torch.where`` against a boolean
  cell mask.

Patched forwards run under ``torch.no_grad`` (TransformerLens builds an autograd graph each time).

Sites and the TransformerLens function each one matches (``by_position`` False / True):

============  ============================================  ==========================================
site          all positions                                 by position
============  ============================================  ==========================================
``z``         ``get_act_patch_attn_head_out_all_pos``        ``get_act_patch_attn_head_out_by_pos``
              ``[layer, head]``                              ``[layer, pos, head]``
``q/k/v``     ``get_act_patch_attn_head_{q,k,v}_all_pos``    ``get_act_patch_attn_head_{q,k,v}_by_pos``
``pattern``   ``get_act_patch_attn_head_pattern_all_pos``    ``get_act_patch_attn_head_pattern_by_pos``
              ``[layer, head]``                              ``[layer, head, dest_pos]``
``resid_pre`` (``[layer]``, no TL equivalent)               ``get_act_patch_resid_pre`` ``[layer, pos]``
``attn_out``  (``[layer]``, no TL equivalent)               ``get_act_patch_attn_out`` ``[layer, pos]``
``mlp_out``   (``[layer]``, no TL equivalent)               ``get_act_patch_mlp_out`` ``[layer, pos]``
============  ============================================  ==========================================

``by_position=None`` (the default) picks what TransformerLens does for the site: all positions for
the head sites, by position for the residual-stream sites.

Metric. With ``metric=None`` the metric is the logit difference between the clean and the corrupt
label, normalised so that the unpatched clean run scores 1 and the unpatched corrupt run 0:

    value = mean_i(ld_patched_i - ld_corrupt_i) / mean_i(ld_clean_i - ld_corrupt_i)

(a ratio of batch means, which is what a scalar TransformerLens metric of the batch-mean logit
difference gives, and which stays finite when one example's clean and corrupt logit differences
happen to coincide). ``per_example[..., i] = (ld_patched_i - ld_corrupt_i) / mean_j(ld_clean_j -
ld_corrupt_j)`` so that ``per_example.mean(-1) == values``; the bootstrap resamples examples and
recomputes the ratio (numerator and denominator) on each resample.

A custom ``metric(logits [n_examples, n_classes])`` follows TransformerLens' convention: it gets
the logits of the whole patched batch and returns a scalar, or a ``[n_examples]`` tensor (then
``values`` is its mean and ``per_example``/CIs are kept). With a scalar metric ``per_example`` and
the CIs are ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pe_interp.hardware import autocast
from pe_interp.io import (
    load_result,
    nan_array,
    register_result,
    write_result,
)
from pe_interp.modes import eval_mode
from probes.inputs import (
    FiniteWatch,
    check_count,
    check_examples,
    check_finite_model,
    check_layers,
    check_token_tensor,
)
from probes.metrics import bootstrap_ci

HEAD_VECTOR_SITES = ("z", "q", "k", "v")
HEAD_SITES = (*HEAD_VECTOR_SITES, "pattern")
BLOCK_SITES = ("resid_pre", "attn_out", "mlp_out")
SITES = HEAD_SITES + BLOCK_SITES
DIRECTIONS = ("clean_to_corrupt", "corrupt_to_clean")
DEFAULT_METRIC_NAME = "normalized_logit_diff"


# ---------------------------------------------------------------------------------------------
# result
# ---------------------------------------------------------------------------------------------
RESULT_KIND = register_result("patching", "PatchResult.load", ("site", "by_position", "direction", "values", "axis_names"))


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
            **{k: v for k, v in self.extra.items() if v is None or isinstance(v, int | float | str | bool)},
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
    "site", "by_position", "direction", "layers", "axis_names", "shape", "metric", "clean_value",
    "corrupt_value", "n_examples", "n_bootstrap", "ci_level", "values", "ci_low", "ci_high", "top",
    "per_example", "kind",
}


# ---------------------------------------------------------------------------------------------
# cell layouts
# ---------------------------------------------------------------------------------------------
def hook_name(site: str, layer: int) -> str:
    """TransformerLens-style hook name of ``site`` in ``layer``."""
    if site in HEAD_SITES:
        return f"blocks.{layer}.attn.hook_{site}"
    if site in BLOCK_SITES:
        return f"blocks.{layer}.hook_{site}"
    raise ValueError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")


def cell_layout(
    site: str, by_position: bool, n_pos: int, n_heads: int
) -> tuple[Tensor, tuple[int, ...], tuple[str, ...]]:
    """Boolean masks selecting each patch cell of one layer, the cell-grid shape and axis names.

    The masks have shape ``[n_cells, 1, *activation_dims]`` with singleton dims where the patch
    covers the whole axis, so ``torch.where(mask, source[None], receiver[None])`` builds the
    patched activation of every cell at once (cells in row-major order of the grid).
    """
    if site in HEAD_VECTOR_SITES:  # activation [batch, pos, head, d_head]
        if by_position:
            eye = torch.eye(n_pos * n_heads, dtype=torch.bool)
            return eye.view(n_pos * n_heads, 1, n_pos, n_heads, 1), (n_pos, n_heads), ("layer", "pos", "head")
        eye = torch.eye(n_heads, dtype=torch.bool)
        return eye.view(n_heads, 1, 1, n_heads, 1), (n_heads,), ("layer", "head")
    if site == "pattern":  # activation [batch, head, dest, src]
        if by_position:
            eye = torch.eye(n_heads * n_pos, dtype=torch.bool)
            return eye.view(n_heads * n_pos, 1, n_heads, n_pos, 1), (n_heads, n_pos), ("layer", "head", "dest_pos")
        eye = torch.eye(n_heads, dtype=torch.bool)
        return eye.view(n_heads, 1, n_heads, 1, 1), (n_heads,), ("layer", "head")
    if site in BLOCK_SITES:  # activation [batch, pos, d_model]
        if by_position:
            eye = torch.eye(n_pos, dtype=torch.bool)
            return eye.view(n_pos, 1, n_pos, 1), (n_pos,), ("layer", "pos")
        return torch.ones(1, 1, 1, 1, dtype=torch.bool), (), ("layer",)
    raise ValueError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")


# ---------------------------------------------------------------------------------------------
# the batched engine
# ---------------------------------------------------------------------------------------------
def _repeat(t: Tensor | None, g: int) -> Tensor | None:
    """``[n, ...] -> [g * n, ...]``, cell-major (rows ``c*n .. c*n+n-1`` belong to cell c)."""
    if t is None:
        return None
    return t.unsqueeze(0).expand(g, *t.shape).reshape(g * t.shape[0], *t.shape[1:])


def _mix(mask: Tensor, src: Tensor, recv: Tensor) -> Tensor:
    """Patched activations of ``mask.shape[0]`` cells, flattened to ``[cells * n, ...]``."""
    out = torch.where(mask, src.unsqueeze(0), recv.unsqueeze(0))
    return out.reshape(-1, *src.shape[1:])


class _Patcher:
    """Patched forwards of one example chunk: caches both runs once, then runs cell groups."""

    def __init__(self, model, site: str, layers: Sequence[int], src_tokens, recv_tokens, src_mask, recv_mask):
        self.model, self.site = model, site
        self.recv_tokens, self.key_valid = model.check_inputs(recv_tokens, recv_mask)
        # z, attn_out and mlp_out resume after the patched layer's attention (or MLP): the
        # layer's own input is the receiving run's, so only its output changes.
        self.late = site in ("z", "attn_out", "mlp_out")
        src_names, recv_names = set(), set()
        for layer in layers:
            recv_names.add(f"blocks.{layer}.hook_resid_pre")
            src_names.add(hook_name(site, layer))
            if self.late:
                recv_names.add(hook_name(site, layer))
                if site == "mlp_out":
                    recv_names.add(f"blocks.{layer}.hook_resid_mid")
        self.src_logits, src_cache = model.run_with_cache(src_tokens, src_mask, names_filter=sorted(src_names))
        self.recv_logits, recv_cache = model.run_with_cache(recv_tokens, recv_mask, names_filter=sorted(recv_names))
        self.src = {k: src_cache[k] for k in src_names}
        self.recv = {k: recv_cache[k] for k in recv_names}

    def run(self, layer: int, mask: Tensor) -> Tensor:
        """Logits ``[cells * n, n_classes]`` of the cells selected by ``mask`` in ``layer``."""
        model, site, g = self.model, self.site, mask.shape[0]
        tokens = _repeat(self.recv_tokens, g)
        key_valid = _repeat(self.key_valid, g)
        name = hook_name(site, layer)
        src = self.src[name]

        def resume(at: int, residual: Tensor, start_at: str = "resid_pre") -> Tensor:
            return model.forward_unchecked(tokens, key_valid, start_at_layer=at, residual=residual, start_at=start_at)

        if site == "mlp_out":  # resid_post = resid_mid + mlp_out: the next layer's input
            mid = _repeat(self.recv[f"blocks.{layer}.hook_resid_mid"], g)
            return resume(layer + 1, mid + _mix(mask, src, self.recv[name]))
        if self.late:  # resid_mid = resid_pre + attn_out; the block's MLP half onward
            attn = model.blocks[layer].attn
            if site == "z":
                z = _mix(mask, src, self.recv[name])
                attn_out = torch.einsum("bphd,hdm->bpm", z, attn.W_O) + attn.b_O
            else:
                attn_out = _mix(mask, src, self.recv[name])
            resid_pre = _repeat(self.recv[f"blocks.{layer}.hook_resid_pre"], g)
            return resume(layer, resid_pre + attn_out, "resid_mid")
        if site == "resid_pre" and layer > 0:
            return resume(layer, _mix(mask, src, self.recv[name]))

        def hook(act: Tensor, hook: Any) -> Tensor:
            recv = act.reshape(g, -1, *act.shape[1:])
            out = torch.where(mask, src.unsqueeze(0), recv)
            return out.reshape(act.shape)

        residual = None if layer == 0 else _repeat(self.recv[f"blocks.{layer}.hook_resid_pre"], g)
        with model.hooks(fwd_hooks=[(name, hook)]):
            return resume(layer, residual)


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------
def bootstrap_ratio_ci(
    numer: Tensor, denom: Tensor | None, n_bootstrap: int, seed: int, level: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Percentile-bootstrap interval of ``mean(numer) / mean(denom)`` (or of ``mean(numer)``):
    :func:`probes.metrics.bootstrap_ci`, as tensors of ``numer``'s dtype and device.

    ``numer``: ``[..., n]`` per-example values; ``denom``: ``[n]`` or None. All cells share the same
    resamples of the examples.
    """
    lo, hi = bootstrap_ci(numer, denom, n_bootstrap=n_bootstrap, ci=level, seed=seed)
    return (torch.as_tensor(lo, device=numer.device).to(numer.dtype),
            torch.as_tensor(hi, device=numer.device).to(numer.dtype))


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def logit_diff(logits: Tensor, good: Tensor, bad: Tensor) -> Tensor:
    """``logits[..., i, good_i] - logits[..., i, bad_i]`` per example (any leading dims)."""
    return logits.gather(-1, good[..., None]).squeeze(-1) - logits.gather(-1, bad[..., None]).squeeze(-1)


def normalized_logit_diff_metric(
    clean_logits: Tensor, corrupt_logits: Tensor, clean_labels: Tensor, corrupt_labels: Tensor
) -> Callable[[Tensor], Tensor]:
    """A scalar TransformerLens-style metric equal to :func:`patch`'s default metric."""
    ld_clean = logit_diff(clean_logits, clean_labels, corrupt_labels).mean()
    ld_corrupt = logit_diff(corrupt_logits, clean_labels, corrupt_labels).mean()

    def metric(logits: Tensor) -> Tensor:
        return (logit_diff(logits, clean_labels, corrupt_labels).mean() - ld_corrupt) / (ld_clean - ld_corrupt)

    return metric


def _check_tokens(name: str, t: Tensor) -> Tensor:
    try:
        check_token_tensor(t, name)
    except ValueError as err:
        raise ValueError(f"patch: {err}") from None
    if t.ndim != 2:
        raise ValueError(f"patch: {name} must be a [batch, pos] integer tensor, got shape {tuple(t.shape)}")
    return t


def patch(
    model,
    clean_tokens: Tensor,
    corrupt_tokens: Tensor,
    *,
    site: str = "z",
    by_position: bool | None = None,
    metric: Callable[[Tensor], Tensor] | None = None,
    clean_labels: Tensor | None = None,
    corrupt_labels: Tensor | None = None,
    pad_mask: Tensor | None = None,
    direction: str = "clean_to_corrupt",
    layers: Sequence[int] | None = None,
    batch_size: int = 256,
    n_bootstrap: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
    amp: bool = False,
) -> PatchResult:
    """Activation patching of ``site`` over every layer (or ``layers``) and cell.

    Args:
        model: a :class:`~pe_interp.HookedPETransformer` (set to eval mode for the call, then
            restored).
        clean_tokens, corrupt_tokens: ``[n, pos]``; row i of each forms a pair.
        site: one of ``z q k v pattern resid_pre attn_out mlp_out``.
        by_position: one cell per position (and head); None: TransformerLens' default for the site.
        metric: ``metric(logits [n, n_classes]) -> scalar | [n]``; None: normalised logit
            difference between ``clean_labels`` and ``corrupt_labels`` (required then).
        pad_mask: ``[n, pos]`` bool (True at real tokens), shared by both runs (pairs are
            aligned); None: each run uses the model's default (``tokens != pad_id``).
        direction: ``"clean_to_corrupt"`` runs the corrupt input and patches in clean activations
            (TransformerLens' convention; "how much does this activation restore?");
            ``"corrupt_to_clean"`` runs the clean input and patches in corrupt activations ("how
            much does corrupting it destroy?"). The default metric is still 1 at the clean run and 0
            at the corrupt run.
        layers: which layers to patch (``values``' first axis follows this order).
        batch_size: rows per forward (cells x examples). With a custom metric every forward holds
            all ``n`` examples of a cell (so the metric sees the whole batch, as in TL).
        n_bootstrap: bootstrap resamples for the CIs (0: none).
        amp: bf16 autocast where the device runs bf16 natively (:mod:`pe_interp.hardware`);
            default fp32, exact.
    """
    check_finite_model(model, "patch")
    if site not in SITES:
        raise ValueError(f"patch: unknown site {site!r}; expected one of {', '.join(SITES)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"patch: direction must be one of {DIRECTIONS}, got {direction!r}")
    clean_tokens = _check_tokens("clean_tokens", clean_tokens)
    corrupt_tokens = _check_tokens("corrupt_tokens", corrupt_tokens)
    if clean_tokens.shape != corrupt_tokens.shape:
        raise ValueError(
            f"patch: clean and corrupt tokens must have the same shape, got {tuple(clean_tokens.shape)} "
            f"and {tuple(corrupt_tokens.shape)}"
        )
    n, n_pos = clean_tokens.shape
    if n == 0:
        raise ValueError("patch: no examples")
    if pad_mask is not None and (pad_mask.shape != clean_tokens.shape or pad_mask.dtype != torch.bool):
        raise ValueError(f"patch: pad_mask must be a bool tensor shaped {tuple(clean_tokens.shape)}")
    check_count(batch_size, "batch_size", 1, "patch")
    check_count(n_bootstrap, "n_bootstrap", 0, "patch")
    cfg = model.cfg
    if layers is None:
        layers = tuple(range(cfg.n_layers))
    layers = tuple(check_layers(model, layers, "patch"))
    if not layers:
        raise ValueError(f"patch: layers must be a non-empty subset of 0..{cfg.n_layers - 1}, got {layers}")
    if site == "mlp_out" and not cfg.d_mlp:
        raise ValueError("patch: site 'mlp_out' needs a model with MLPs (d_mlp > 0)")
    if by_position is None:
        by_position = site in BLOCK_SITES
    default_metric = metric is None
    device = model.W_E.device
    if default_metric and (clean_labels is None or corrupt_labels is None):
        raise ValueError("patch: the default metric needs clean_labels and corrupt_labels (or pass metric=)")
    # both runs share pad_mask (pairs are aligned): it must fit the clean and the corrupt tokens
    clean_tokens, clean_labels, mask = check_examples(model, clean_tokens, clean_labels, pad_mask, who="patch",
                                                      what="clean_tokens", label_name="clean_labels")
    corrupt_tokens, corrupt_labels, _ = check_examples(model, corrupt_tokens, corrupt_labels, pad_mask, who="patch",
                                                       what="corrupt_tokens", label_name="corrupt_labels")
    pad_mask = None if pad_mask is None else mask
    if direction == "clean_to_corrupt":
        src_tokens, recv_tokens = clean_tokens, corrupt_tokens
    else:
        src_tokens, recv_tokens = corrupt_tokens, clean_tokens

    masks, cell_shape, axis_names = cell_layout(site, by_position, n_pos, cfg.n_heads)
    masks = masks.to(device)
    n_cells = masks.shape[0]
    chunk = n if not default_metric else min(n, batch_size)
    group = max(1, batch_size // chunk)

    watch = FiniteWatch()  # every logit of the call, checked once after the loop
    with eval_mode(model), torch.no_grad(), autocast(device, amp):
        ld_cells = None  # default metric: [len(layers), n_cells, n] patched logit differences
        custom_vals: list[list[Tensor]] = [[None] * n_cells for _ in layers]  # type: ignore[list-item]
        src_logits_all, recv_logits_all = [], []
        if default_metric:
            ld_cells = torch.empty(len(layers), n_cells, n, dtype=torch.float64, device=device)
        for start in range(0, n, chunk):
            rows = slice(start, min(n, start + chunk))
            m = None if pad_mask is None else pad_mask[rows]
            patcher = _Patcher(model, site, layers, src_tokens[rows], recv_tokens[rows], m, m)
            src_logits_all.append(patcher.src_logits)
            recv_logits_all.append(patcher.recv_logits)
            k = rows.stop - rows.start
            for li, layer in enumerate(layers):
                for c0 in range(0, n_cells, group):
                    c1 = min(n_cells, c0 + group)
                    logits = watch.see(patcher.run(layer, masks[c0:c1]).reshape(c1 - c0, k, -1))
                    if default_metric:
                        good = clean_labels[rows].expand(c1 - c0, k)
                        bad = corrupt_labels[rows].expand(c1 - c0, k)
                        ld_cells[li, c0:c1, rows] = logit_diff(logits, good, bad).double()
                    else:
                        for c in range(c1 - c0):
                            custom_vals[li][c0 + c] = torch.as_tensor(metric(logits[c])).detach()
        src_logits = watch.see(torch.cat(src_logits_all))
        recv_logits = watch.see(torch.cat(recv_logits_all))
    watch.check("patch", amp)
    clean_logits, corrupt_logits = (src_logits, recv_logits) if direction == "clean_to_corrupt" else (recv_logits, src_logits)

    grid = (len(layers), *cell_shape)
    ci_low = ci_high = None
    if default_metric:
        ld_clean = logit_diff(clean_logits, clean_labels, corrupt_labels).double()
        ld_corrupt = logit_diff(corrupt_logits, clean_labels, corrupt_labels).double()
        denom = (ld_clean - ld_corrupt).mean()
        if not torch.isfinite(denom) or denom.abs() < 1e-12:
            raise ValueError(
                "patch: the clean and corrupt runs have the same mean logit difference, so the "
                "normalised metric is undefined; pass metric= or use other pairs"
            )
        numer = ld_cells - ld_corrupt  # [L, cells, n]
        per_example = (numer / denom).reshape(*grid, n)
        values = per_example.mean(-1)
        if n_bootstrap > 0:
            ci_low, ci_high = bootstrap_ratio_ci(numer, ld_clean - ld_corrupt, n_bootstrap, seed, ci_level)
            ci_low, ci_high = ci_low.reshape(grid), ci_high.reshape(grid)
        clean_value, corrupt_value = 1.0, 0.0
        metric_name = DEFAULT_METRIC_NAME
        extra = {
            "logit_diff_clean": float(ld_clean.mean()),
            "logit_diff_corrupt": float(ld_corrupt.mean()),
            # how well the pairs separate the labels: the normaliser over its per-example spread
            "denominator_z": float(denom / ((ld_clean - ld_corrupt).std() / math.sqrt(n)))
            if n > 1 and float((ld_clean - ld_corrupt).std()) > 0
            else None,
        }
        dtype = clean_logits.dtype
        values, per_example = values.to(dtype), per_example.to(dtype)
        if ci_low is not None:
            ci_low, ci_high = ci_low.to(dtype), ci_high.to(dtype)
    else:
        flat = [v for row in custom_vals for v in row]
        shapes = {tuple(v.shape) for v in flat}
        if shapes == {()}:
            values = torch.stack(flat).reshape(grid)
            per_example = None
        elif shapes == {(n,)}:
            per_example = torch.stack(flat).reshape(*grid, n)
            values = per_example.mean(-1)
            if n_bootstrap > 0:
                ci_low, ci_high = bootstrap_ratio_ci(per_example, None, n_bootstrap, seed, ci_level)
        else:
            raise ValueError(f"patch: metric must return a scalar or a [{n}] tensor, got shapes {sorted(shapes)}")
        clean_value = float(torch.as_tensor(metric(clean_logits)).double().mean())
        corrupt_value = float(torch.as_tensor(metric(corrupt_logits)).double().mean())
        metric_name = getattr(metric, "__name__", "custom")
        extra = {}
    return PatchResult(
        values=values,
        per_example=per_example,
        ci_low=ci_low,
        ci_high=ci_high,
        site=site,
        by_position=bool(by_position),
        direction=direction,
        layers=layers,
        axis_names=axis_names,
        metric_name=metric_name,
        clean_value=clean_value,
        corrupt_value=corrupt_value,
        n_examples=n,
        n_bootstrap=n_bootstrap if ci_low is not None else 0,
        ci_level=ci_level,
        extra=extra,
    )


__all__ = [
    "BLOCK_SITES",
    "DIRECTIONS",
    "HEAD_SITES",
    "SITES",
    "PatchResult",
    "bootstrap_ratio_ci",
    "cell_layout",
    "hook_name",
    "logit_diff",
    "normalized_logit_diff_metric",
    "patch",
]

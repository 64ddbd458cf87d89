"""Per-head gradients: each head's slice of the Q/K/V/O weights (and the encoding's per-head
parameters), per-example gradients through the model's own forward, and their coherence (see
:mod:`probes.gradients.coherence`, whose gradient seed at initialisation is built on these)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_interp.util.modes import eval_mode

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

ALL_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "encoding")
QK_PARAMS = ("W_Q", "W_K", "b_Q", "b_K", "encoding")


# ---------------------------------------------------------------------------------------------
# the core statistic
# ---------------------------------------------------------------------------------------------
def coherence(vectors: Tensor) -> Tensor:
    """``||mean_i v_i|| / mean_i ||v_i||`` of per-example vectors ``[n, d]`` (batched over
    leading dims ``[..., n, d]``); NaN when every vector is zero."""
    v = vectors.double()
    num = v.mean(-2).norm(dim=-1)
    den = v.norm(dim=-1).mean(-1)
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.full_like(den, math.nan))


# ---------------------------------------------------------------------------------------------
# which slices of which parameters belong to a head
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadSlice:
    """Parameter ``name`` (``param_ndim`` dims) split by head: heads along ``head_axis``; the
    layer fixed (``layer``, block parameters) or along ``layer_axis`` (stacked encoding tables)."""

    name: str
    param_ndim: int
    head_axis: int
    layer: int | None = None
    layer_axis: int | None = None

    def sq_norms(self, g: Tensor, n_layers: int) -> Tensor:
        """Squared norm per (leading example dims, layer, head) of gradients ``g [..., *param]``.

        Returns ``[..., n_layers, n_heads]`` (zeros for layers this parameter is not in)."""
        lead = g.ndim - self.param_ndim
        shape = g.shape[lead:]
        sq = g.double().pow(2)
        keep = {lead + self.head_axis} | (
            {lead + self.layer_axis} if self.layer_axis is not None else set()
        )
        summed = tuple(d for d in range(lead, g.ndim) if d not in keep)
        if summed:  # (torch sums every dim for an empty tuple)
            sq = sq.sum(dim=summed)  # [..., (L,) H] in axis order
        if self.layer_axis is not None:
            if self.layer_axis > self.head_axis:
                sq = sq.transpose(-1, -2)
            return sq
        out = torch.zeros(
            *g.shape[:lead], n_layers, shape[self.head_axis], dtype=sq.dtype, device=sq.device
        )
        out[..., self.layer, :] = sq
        return out


def head_slices(model: ProbeModel, params: Sequence[str] = ALL_PARAMS) -> list[HeadSlice]:
    """The per-head parameter slices of ``model`` for the kinds in ``params`` (see the module
    docstring)."""
    bad = [p for p in params if p not in ALL_PARAMS]
    if bad or not params:
        raise ValueError(f"params must be a non-empty subset of {ALL_PARAMS}, got {tuple(params)}")
    named = dict(model.named_parameters())
    out = []
    for layer in range(model.cfg.n_layers):
        for leaf in params:
            if leaf == "encoding":
                continue
            name = f"blocks.{layer}.attn.{leaf}"
            out.append(HeadSlice(name, named[name].ndim, head_axis=0, layer=layer))
    if "encoding" in params:  # what the encoding says holds one slice per head
        for name, axes in model.encoding.head_parameters().items():
            full = f"encoding.{name}"
            out.append(
                HeadSlice(full, named[full].ndim, head_axis=axes.head, layer_axis=axes.layer)
            )
    return out


# ---------------------------------------------------------------------------------------------
# per-example gradients
# ---------------------------------------------------------------------------------------------
class _Unchecked(nn.Module):
    """``model.forward_unchecked`` as a module's ``forward``, for ``torch.func.functional_call``
    (``vmap`` cannot trace the data-dependent input checks of ``model.forward``)."""

    def __init__(self, model: ProbeModel):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, key_valid: Tensor | None) -> Tensor:
        return self.model.forward_unchecked(tokens, key_valid)


def batch_parts(batch: Any, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    if hasattr(batch, "tokens"):
        return batch.tokens, batch.labels, batch.pad_mask
    if isinstance(batch, tuple | list) and len(batch) in (2, 3):
        tokens, labels = batch[0], batch[1]
        pad_mask = batch[2] if len(batch) == 3 else tokens != pad_id
        return tokens, labels, pad_mask
    raise ValueError(
        "batch must be a Batch (tokens, labels, pad_mask) or a (tokens, labels[, pad_mask]) tuple"
    )


def per_example_grads(
    model: ProbeModel,
    tokens: Tensor,
    labels: Tensor,
    pad_mask: Tensor,
    names: Sequence[str],
    *,
    method: str = "vmap",
) -> dict[str, Tensor]:
    """Gradients of each example's cross-entropy w.r.t. the parameters ``names``:
    ``{name: [n, *param.shape]}`` (model in whatever mode it is in; call under eval)."""
    params = dict(model.named_parameters())
    if method == "loop":
        out: dict[str, list[Tensor]] = {k: [] for k in names}
        for i in range(tokens.shape[0]):
            logits = model(tokens[i : i + 1], pad_mask[i : i + 1])
            loss = F.cross_entropy(logits, labels[i : i + 1])
            gs = torch.autograd.grad(loss, [params[k] for k in names], allow_unused=True)
            for k, g in zip(names, gs):
                out[k].append(torch.zeros_like(params[k]) if g is None else g.detach())
        return {k: torch.stack(v) for k, v in out.items()}
    if method != "vmap":
        raise ValueError(f"per_example_grads: method must be 'vmap' or 'loop', got {method!r}")
    from torch.func import functional_call, grad, vmap

    wrapper = _Unchecked(model)
    frozen = {f"model.{k}": v.detach() for k, v in params.items() if k not in names}
    sub = {k: params[k].detach() for k in names}
    mask_padding = (
        model.cfg.mask_padding
    )  # the padding mask is always passed (all-True rows give the same result)

    def loss_fn(sub_params, tok, pm, y):
        p = dict(frozen)
        p.update({f"model.{k}": v for k, v in sub_params.items()})
        logits = functional_call(wrapper, p, (tok[None], pm[None] if mask_padding else None))
        return F.cross_entropy(logits, y[None])

    # An identity hook on hook_attn_scores makes every layer take the eager attention path,
    # which vmap batches natively (SDPA's CPU kernel has no batching rule and falls back to a loop).
    eager = [(f"blocks.{i}.attn.hook_attn_scores", _identity) for i in range(model.cfg.n_layers)]
    with model.hooks(fwd_hooks=eager):
        return vmap(grad(loss_fn), in_dims=(None, 0, 0, 0))(sub, tokens, pad_mask, labels)


def _identity(x: Tensor, hook: Any) -> Tensor:
    return x


def head_gradient_stats(
    model: ProbeModel,
    tokens: Tensor,
    labels: Tensor,
    pad_mask: Tensor,
    *,
    chunk_size: int = 16,
    method: str = "vmap",
    params: Sequence[str] = ALL_PARAMS,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per head ``[n_layers, n_heads]``: coherence, ``||mean_i g_i||`` and ``mean_i ||g_i||``."""
    cfg = model.cfg
    slices = head_slices(model, params)
    names = [s.name for s in slices]
    n = tokens.shape[0]
    device = model.W_E.device
    L, H = cfg.n_layers, cfg.n_heads
    norm_sum = torch.zeros(L, H, dtype=torch.float64, device=device)
    grad_sum: dict[str, Tensor] = {}
    with eval_mode(model):
        for start in range(0, n, chunk_size):
            rows = slice(start, min(n, start + chunk_size))
            grads = per_example_grads(
                model,
                tokens[rows].to(device),
                labels[rows].to(device),
                pad_mask[rows].to(device),
                names,
                method=method,
            )
            sq = torch.zeros(rows.stop - rows.start, L, H, dtype=torch.float64, device=device)
            for s in slices:
                g = grads[s.name]
                sq += s.sq_norms(g, L)
                grad_sum[s.name] = grad_sum[s.name] + g.sum(0) if s.name in grad_sum else g.sum(0)
            norm_sum += sq.sqrt().sum(0)
    mean_sq = torch.zeros(L, H, dtype=torch.float64, device=device)
    for s in slices:
        mean_sq += s.sq_norms(grad_sum[s.name] / n, L)
    norm_of_mean = mean_sq.sqrt()
    mean_norm = norm_sum / n
    coh = torch.where(
        mean_norm > 0,
        norm_of_mean / mean_norm.clamp(min=1e-300),
        torch.full_like(mean_norm, math.nan),
    )
    return coh.cpu(), norm_of_mean.cpu(), mean_norm.cpu()


__all__ = [
    "ALL_PARAMS",
    "QK_PARAMS",
    "HeadSlice",
    "coherence",
    "head_gradient_stats",
    "head_slices",
    "per_example_grads",
]

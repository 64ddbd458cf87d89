"""Gradient "seeds" at initialisation: how coherent is each head's task-loss gradient over a batch?

Paper digest §7 (Propositions 6.1/6.2): under RoPE the positional-learning gradient is claimed to
have a deterministic non-zero component (a "seed") that survives averaging over a batch, while an
additive bias's per-example gradients are claimed to cancel. We measure, for every head and
several random initialisations, the **coherence** of the per-example gradients ``g_i`` of the
cross-entropy loss with respect to that head's parameters::

    coherence = || mean_i g_i || / mean_i || g_i ||      in [0, 1]

1 when every example pushes the head's parameters the same way (the batch gradient keeps all of
each example's signal), about ``1/sqrt(n)`` for independent random directions, 0 when they cancel
exactly.

A head's parameters are its slices of ``W_Q, W_K, W_V, W_O`` and of ``b_Q, b_K, b_V``, plus its
slice of any per-head encoding parameter (``"encoding"``): the T5 bias table ``rel_bias[layer,
head]`` and decoupled RoPE's ``W_QR[layer, :, head]``. ``params`` selects a subset, e.g.
``QK_PARAMS`` for the parameters that shape the attention logits, where position enters (at
initialisation the value/output gradients, which do not see position directly, dominate the full
norm). Shared parameters (``b_O``, decoupled RoPE's ``W_KR``, a learned absolute table) belong to
no head and are left out. The model runs in eval mode (no dropout), so the gradients are deterministic.

Per-example gradients come from ``torch.func`` (``functional_call`` + ``vmap(grad)``), in chunks of
``chunk_size`` examples; ``method="loop"`` computes them one example at a time with ordinary
autograd through ``model.forward`` (the reference that the vmap path is tested against).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_interp.config import ModelConfig
from pe_interp.io import load_result, register_result, write_result
from pe_interp.model import HookedPETransformer
from pe_interp.modes import eval_mode
from probes.inputs import check_labels

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
        keep = {lead + self.head_axis} | ({lead + self.layer_axis} if self.layer_axis is not None else set())
        summed = tuple(d for d in range(lead, g.ndim) if d not in keep)
        if summed:  # (torch sums every dim for an empty tuple)
            sq = sq.sum(dim=summed)  # [..., (L,) H] in axis order
        if self.layer_axis is not None:
            if self.layer_axis > self.head_axis:
                sq = sq.transpose(-1, -2)
            return sq
        out = torch.zeros(*g.shape[:lead], n_layers, shape[self.head_axis], dtype=sq.dtype, device=sq.device)
        out[..., self.layer, :] = sq
        return out


def head_slices(model, params: Sequence[str] = ALL_PARAMS) -> list[HeadSlice]:
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
            out.append(HeadSlice(full, named[full].ndim, head_axis=axes.head, layer_axis=axes.layer))
    return out


# ---------------------------------------------------------------------------------------------
# per-example gradients
# ---------------------------------------------------------------------------------------------
class _Unchecked(nn.Module):
    """``model.forward_unchecked`` as a module's ``forward``, for ``torch.func.functional_call``
    (``vmap`` cannot trace the data-dependent input checks of ``model.forward``)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, key_valid: Tensor | None) -> Tensor:
        return self.model.forward_unchecked(tokens, key_valid)


def _batch_parts(batch: Any, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    if hasattr(batch, "tokens"):
        return batch.tokens, batch.labels, batch.pad_mask
    if isinstance(batch, tuple | list) and len(batch) in (2, 3):
        tokens, labels = batch[0], batch[1]
        pad_mask = batch[2] if len(batch) == 3 else tokens != pad_id
        return tokens, labels, pad_mask
    raise ValueError("batch must be a Batch (tokens, labels, pad_mask) or a (tokens, labels[, pad_mask]) tuple")


def per_example_grads(
    model,
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
    mask_padding = model.cfg.mask_padding  # the padding mask is always passed (all-True rows give the same result)

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
    model,
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
                model, tokens[rows].to(device), labels[rows].to(device), pad_mask[rows].to(device), names, method=method
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
    coh = torch.where(mean_norm > 0, norm_of_mean / mean_norm.clamp(min=1e-300), torch.full_like(mean_norm, math.nan))
    return coh.cpu(), norm_of_mean.cpu(), mean_norm.cpu()


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
RESULT_KIND = register_result("gradient coherence", "CoherenceResult.load", ("encoding", "seeds", "values", "norm_of_mean", "mean_norm"))


@dataclass(frozen=True, eq=False)
class CoherenceResult:
    """Gradient coherence per (init seed, layer, head).

    - ``values [n_seeds, n_layers, n_heads]``: coherence (see the module docstring);
    - ``norm_of_mean``/``mean_norm``: its numerator ``||mean g||`` and denominator ``mean ||g||``;
    - ``mean``/``std``: over seeds (population std; 0 for one seed).
    """

    values: Tensor
    norm_of_mean: Tensor
    mean_norm: Tensor
    seeds: tuple[int, ...]
    encoding: str
    n_examples: int
    params: tuple[str, ...] = ALL_PARAMS

    @property
    def random_baseline(self) -> float:
        """About what ``n`` independent random directions of equal norm give: ``1/sqrt(n)``."""
        return 1.0 / math.sqrt(self.n_examples)

    @property
    def mean(self) -> Tensor:
        return self.values.mean(0)

    @property
    def std(self) -> Tensor:
        return self.values.std(0, unbiased=False)

    def layer_summary(self) -> dict[str, Tensor]:
        """Per seed and layer: the max over heads, the mean over heads, and their ratio."""
        mx = self.values.amax(-1)
        mn = self.values.mean(-1)
        return {"max": mx, "mean": mn, "max_over_mean": mx / mn}

    def to_dict(self) -> dict[str, Any]:
        return {
            "encoding": self.encoding,
            "seeds": list(self.seeds),
            "n_examples": self.n_examples,
            "params": list(self.params),
            "random_baseline": self.random_baseline,
            "values": self.values.tolist(),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "norm_of_mean": self.norm_of_mean.tolist(),
            "mean_norm": self.mean_norm.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CoherenceResult:
        """Invert :meth:`to_dict` (``mean``, ``std`` and ``random_baseline`` are recomputed)."""

        def tensor(x: Any) -> Tensor:
            return torch.tensor([[[math.nan if v is None else v for v in row] for row in seed] for seed in x],
                                dtype=torch.float32)

        return cls(
            values=tensor(d["values"]),
            norm_of_mean=tensor(d["norm_of_mean"]),
            mean_norm=tensor(d["mean_norm"]),
            seeds=tuple(int(s) for s in d["seeds"]),
            encoding=d["encoding"],
            n_examples=int(d["n_examples"]),
            params=tuple(d.get("params", ALL_PARAMS)),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> CoherenceResult:
        return load_result(path, RESULT_KIND, cls.from_dict)


def gradient_coherence(
    model_or_cfg,
    batch: Any,
    *,
    init_seeds: Sequence[int] | None = None,
    chunk_size: int = 16,
    method: str = "vmap",
    params: Sequence[str] = ALL_PARAMS,
) -> CoherenceResult:
    """Per-head gradient coherence at initialisation over ``init_seeds``.

    ``model_or_cfg``: a :class:`~pe_interp.ModelConfig` (a fresh model per seed, default seeds
    0, 1, 2) or a model (its weights as they are when ``init_seeds`` is None; otherwise fresh models
    from its config with each seed, on its device and dtype). ``batch``: a task ``Batch`` or a
    ``(tokens, labels[, pad_mask])`` tuple.
    """
    if isinstance(model_or_cfg, ModelConfig):
        cfg, base = model_or_cfg, None
        seeds = tuple(init_seeds) if init_seeds is not None else (0, 1, 2)
    else:
        base = model_or_cfg
        cfg = base.cfg
        seeds = tuple(init_seeds) if init_seeds is not None else (cfg.seed,)
    if not seeds:
        raise ValueError("gradient_coherence: init_seeds is empty")
    tokens, labels, pad_mask = _batch_parts(batch, cfg.pad_id)
    if tokens.shape[0] < 1:
        raise ValueError("gradient_coherence: empty batch")
    try:
        labels = check_labels(labels, cfg.n_classes, tokens.shape[0])
    except ValueError as err:
        raise ValueError(f"gradient_coherence: {err}") from None
    vals, nom, mn = [], [], []
    for s in seeds:
        if base is not None and init_seeds is None:
            model = base
        else:
            model = HookedPETransformer(cfg.replace(seed=int(s), device="cpu"))
            if base is not None:
                model = model.to(device=base.W_E.device, dtype=base.W_E.dtype)
            elif cfg.device != "cpu":
                model = model.to(cfg.device)
        c, a, b = head_gradient_stats(
            model, tokens, labels.long(), pad_mask, chunk_size=chunk_size, method=method,
            params=params,
        )
        vals.append(c)
        nom.append(a)
        mn.append(b)
    return CoherenceResult(
        values=torch.stack(vals).float(),
        norm_of_mean=torch.stack(nom).float(),
        mean_norm=torch.stack(mn).float(),
        seeds=tuple(int(s) for s in seeds),
        encoding=str(getattr(cfg, "encoding_name", cfg.encoding)),
        n_examples=int(tokens.shape[0]),
        params=tuple(params),
    )


SET_KIND = register_result("gradient coherence set", "load_coherence", ("results",))


def save_coherence(path: str | Path, results: dict[str, CoherenceResult], key: Any = None) -> Path:
    """Several encodings' coherence results in one file ``{"key": key, "results": {encoding:
    CoherenceResult.to_dict()}}`` (``key``: what they were computed from, for the writer to tell
    whether they are current)."""
    data = {"key": key, "results": {k: r.to_dict() for k, r in results.items()}}
    return write_result(path, SET_KIND, data, sort_keys=False)  # the encodings stay in their order


def load_coherence(path: str | Path) -> tuple[dict[str, CoherenceResult], Any]:
    """Invert :func:`save_coherence`: ``(results, key)``."""
    def from_dict(stored: dict[str, Any]) -> tuple[dict[str, CoherenceResult], Any]:
        return {k: CoherenceResult.from_dict(d) for k, d in stored["results"].items()}, stored.get("key")

    return load_result(path, SET_KIND, from_dict)


def coherence_report(
    base_cfg,
    batch: Any,
    *,
    encodings: Sequence[Any] = ("rope", "alibi", "t5", "sinusoidal"),
    init_seeds: Sequence[int] = (0, 1, 2),
    chunk_size: int = 16,
    params: Sequence[str] = ALL_PARAMS,
) -> dict[str, CoherenceResult]:
    """:func:`gradient_coherence` of ``base_cfg`` with each of ``encodings`` (same batch, same
    seeds), keyed by encoding name. Print it with :func:`format_coherence_report`."""
    out = {}
    for enc in encodings:
        cfg = base_cfg.replace(encoding=enc)
        r = gradient_coherence(cfg, batch, init_seeds=init_seeds, chunk_size=chunk_size, params=params)
        out[r.encoding] = r
    return out


def format_coherence_report(results: dict[str, CoherenceResult]) -> str:
    """A text table: per encoding and layer, the max and mean head coherence (mean +- std over
    seeds) and the max/mean ratio (how much one head stands out)."""
    lines = [f"{'encoding':<18}{'layer':>6}{'max head':>18}{'mean head':>18}{'max/mean':>10}"]
    first = next(iter(results.values()), None)
    if first is not None:
        lines.insert(
            0,
            f"# params {','.join(first.params)}; {first.n_examples} examples (1/sqrt(n) = "
            f"{first.random_baseline:.3f}); mean ± std over seeds {list(first.seeds)}",
        )
    for name, r in results.items():
        s = r.layer_summary()
        for layer in range(r.values.shape[1]):
            mx, mn, ratio = s["max"][:, layer], s["mean"][:, layer], s["max_over_mean"][:, layer]
            lines.append(
                f"{name:<18}{layer:>6}"
                f"{float(mx.mean()):>11.4f} ± {float(mx.std(unbiased=False)):<5.3f}"
                f"{float(mn.mean()):>11.4f} ± {float(mn.std(unbiased=False)):<5.3f}"
                f"{float(ratio.mean()):>10.3f}"
            )
    return "\n".join(lines)


__all__ = [
    "ALL_PARAMS",
    "QK_PARAMS",
    "CoherenceResult",
    "HeadSlice",
    "coherence",
    "coherence_report",
    "format_coherence_report",
    "gradient_coherence",
    "head_gradient_stats",
    "head_slices",
    "load_coherence",
    "per_example_grads",
    "save_coherence",
]

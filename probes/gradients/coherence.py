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
from torch import Tensor

from pe_interp.config.model import ModelConfig
from pe_interp.models.hooked.model import HookedPETransformer
from pe_interp.util.io import load_result, register_result, write_result
from probes.common.inputs import check_labels
from probes.gradients.per_head import (  # noqa: F401 - re-exported, as before the split
    ALL_PARAMS,
    QK_PARAMS,
    HeadSlice,
    batch_parts,
    coherence,
    head_gradient_stats,
    head_slices,
    per_example_grads,
)

# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
RESULT_KIND = register_result(
    "gradient coherence",
    "CoherenceResult.load",
    ("encoding", "seeds", "values", "norm_of_mean", "mean_norm"),
)


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
            return torch.tensor(
                [[[math.nan if v is None else v for v in row] for row in seed] for seed in x],
                dtype=torch.float32,
            )

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
    tokens, labels, pad_mask = batch_parts(batch, cfg.pad_id)
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
            model,
            tokens,
            labels.long(),
            pad_mask,
            chunk_size=chunk_size,
            method=method,
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
        encoding=cfg.encoding_name,
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
        return {k: CoherenceResult.from_dict(d) for k, d in stored["results"].items()}, stored.get(
            "key"
        )

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
        r = gradient_coherence(
            cfg, batch, init_seeds=init_seeds, chunk_size=chunk_size, params=params
        )
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

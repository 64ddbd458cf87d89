"""Which implementation computes attention under CPU bf16 autocast: one fixed route by default.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` the same attention can run three ways, and
which is fastest depends on the shape and the CPU:

- ``math``: the eager path (:meth:`Attention._eager`): bf16 matmuls for ``q.k`` and
  ``pattern.v``, the softmax in fp32 (autocast's rule for softmax);
- ``sdpa``: ``F.scaled_dot_product_attention`` on the bf16 inputs (PyTorch's CPU flash
  attention);
- ``sdpa32``: the same call on fp32 copies of the inputs, the output cast back to bf16.

Measured on an avx512_bf16/AMX Xeon at the paper's size (d_head 16): PyTorch's CPU flash
attention's *backward* is several times slower in bf16 than in fp32, so ``sdpa`` made the whole
bf16 training step slower than fp32 (benchmarks/RESULTS.md). ``sdpa32`` was the fastest there
for training, and the most exact; it is :data:`DEFAULT_ROUTE`, used for every shape.

Reproducibility (issue 54): the three routes round differently, so the route decides the
weights. The route used to be chosen by timing each one in the process (like cuDNN's benchmark
mode); at the ``quick`` size ``math`` and ``sdpa32`` take about the same time, and a fresh
process chose ``math`` for training in 1 of 6 idle runs and 2 of 6 runs beside a busy process
(2 threads), so the same seed gave other weights. The route is therefore fixed unless asked for:
``PE_INTERP_ATTN_ROUTE=math|sdpa|sdpa32`` (or :func:`force`) uses one route everywhere, and
``PE_INTERP_ATTN_ROUTE=fastest`` measures, per :class:`RouteKey`, each route on random inputs of
that shape and keeps the fastest for the rest of the process (faster where ``math`` wins, but the
weights then depend on the machine's load). Either way the Trainer records the routes it used
with its checkpoint (:func:`chosen`) and :func:`pin`\\ s them on resume, which keeps a resumed run
bit-identical to an uninterrupted one. fp32 attention does not come here: it runs SDPA (or the
eager path when a hook needs it), as before.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

ROUTES = ("math", "sdpa", "sdpa32")
DEFAULT_ROUTE = "sdpa32"  # the route when none is forced: fixed, so that a seed fixes the weights
MEASURE = "fastest"  # PE_INTERP_ATTN_ROUTE=fastest: choose by timing (load-dependent numbers)
OVERRIDE_ENV = "PE_INTERP_ATTN_ROUTE"
REPEATS = 3  # timed calls per route (the minimum is kept), after one untimed warm-up call

__all__ = [
    "DEFAULT_ROUTE",
    "MEASURE",
    "OVERRIDE_ENV",
    "ROUTES",
    "RouteKey",
    "choose",
    "chosen",
    "force",
    "pin",
    "policy",
    "reset",
    "timings",
]


@dataclass(frozen=True)
class RouteKey:
    """What the choice depends on. ``text`` is the form stored in checkpoints."""

    device: str
    dtype: str
    q_shape: tuple[int, ...]  # [batch, pos, head, d_qk]
    v_shape: tuple[int, ...]
    mask_shape: tuple[int, ...] | None
    dropout: bool
    grad: bool

    @property
    def text(self) -> str:
        dims = lambda s: "x".join(map(str, s)) if s is not None else "none"  # noqa: E731
        return (
            f"{self.device}/{self.dtype}/q{dims(self.q_shape)}/v{dims(self.v_shape)}/mask{dims(self.mask_shape)}"
            f"/dropout{int(self.dropout)}/grad{int(self.grad)}"
        )


_chosen: dict[str, str] = {}
_timings: dict[str, dict[str, float]] = {}
_forced: list[str] = []


def _override() -> str | None:
    if _forced:
        return _forced[-1]
    value = os.environ.get(OVERRIDE_ENV)
    if value is None or value == "":
        return None
    if value not in ROUTES + (MEASURE,):
        raise ValueError(
            f"${OVERRIDE_ENV} must be one of {', '.join(ROUTES + (MEASURE,))}, got {value!r}"
        )
    return value


def policy() -> str:
    """How a new shape gets its route in this process: a route of :data:`ROUTES` (forced, or
    :data:`DEFAULT_ROUTE`), or :data:`MEASURE` (the fastest, by timing). Routes pinned from a
    resumed checkpoint take precedence over the default and the measurement."""
    return _override() or DEFAULT_ROUTE


@contextlib.contextmanager
def force(route: str) -> Iterator[None]:
    """Use ``route`` for every bf16 CPU attention inside the block (tests, benchmarks);
    :data:`MEASURE` measures each new shape instead."""
    if route not in ROUTES + (MEASURE,):
        raise ValueError(f"route must be one of {', '.join(ROUTES + (MEASURE,))}, got {route!r}")
    _forced.append(route)
    try:
        yield
    finally:
        _forced.pop()


def chosen() -> dict[str, str]:
    """Every choice made in this process so far, ``{RouteKey.text: route}``."""
    return dict(_chosen)


def timings() -> dict[str, dict[str, float]]:
    """The measured seconds per route behind each choice (minimum of :data:`REPEATS`)."""
    return {k: dict(v) for k, v in _timings.items()}


def pin(choices: dict[str, str]) -> None:
    """Adopt earlier choices (a resumed run's), so that they are not measured again."""
    for key, route in choices.items():
        if route not in ROUTES:
            raise ValueError(
                f"attention route for {key} must be one of {', '.join(ROUTES)}, got {route!r}"
            )
    _chosen.update(choices)


def reset() -> None:
    """Forget every choice (tests)."""
    _chosen.clear()
    _timings.clear()


def choose(
    key: RouteKey,
    run: Callable[[str, Tensor, Tensor, Tensor], Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
) -> str:
    """The route for ``key``: a forced route, else the remembered (or pinned) choice, else
    :data:`DEFAULT_ROUTE`; with ``PE_INTERP_ATTN_ROUTE=fastest``, the fastest of :data:`ROUTES`
    measured now with ``run(route, q, k, v)`` on random inputs shaped like ``q, k, v`` (the real
    inputs are not touched, and no RNG state changes)."""
    how = policy()
    if how != MEASURE and _override() is not None:
        return how
    text = key.text
    if text not in _chosen:
        if how == MEASURE:
            _timings[text] = _measure(run, q, k, v, key.grad)
            _chosen[text] = min(_timings[text], key=_timings[text].__getitem__)
        else:
            _chosen[text] = how
    return _chosen[text]


def _measure(run, q: Tensor, k: Tensor, v: Tensor, grad: bool) -> dict[str, float]:
    gen = torch.Generator(device=q.device).manual_seed(0)

    def fresh(x: Tensor) -> Tensor:
        t = torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)
        return t.requires_grad_(grad)

    inputs = [fresh(x) for x in (q, k, v)]
    seconds: dict[str, float] = {}
    with (
        torch.random.fork_rng(devices=[q.device.index or 0] if q.is_cuda else []),
        torch.set_grad_enabled(grad),
    ):
        for route in ROUTES:
            best = float("inf")
            for i in range(REPEATS + 1):
                t0 = time.perf_counter()
                out = run(route, *inputs)
                if grad:
                    out.float().sum().backward()
                if i:  # the first call warms caches up
                    best = min(best, time.perf_counter() - t0)
                for x in inputs:
                    x.grad = None
            seconds[route] = best
    return seconds

"""Small circuits for the tests: seeded random models in float64, clean/corrupt token pairs and
labelled batches, the metrics and spans the circuit tests score them with, and hook helpers (the
per-head input forks switched on, a cache, gradients at hooks by autograd)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from conftest import tiny_model

from pe_interp import HookedPETransformer

VOCAB, CLASSES, POS = 20, 5, 8
LENGTHS = (8, 6, 7)  # right-padded with PAD_ID = 0

FN = lambda logits, good, bad: logits[:, 1] - logits[:, 0]  # noqa: E731
# Each row of random_pairs() cut into four spans (ids 0..3), position by position.
SPANS = torch.tensor([[0, 0, 1, 2, 2, 2, 3, 3], [0, 1, 1, 2, 2, 3, 3, 3], [0, 0, 1, 1, 2, 2, 2, 3]])


def random_model(encoding: str, **kw) -> HookedPETransformer:
    """Three layers, two heads, ``init_std=0.4``, seed 5, in float64 and eval mode."""
    cfg = dict(n_layers=3, d_vocab=VOCAB, n_classes=CLASSES, init_std=0.4, seed=5)
    return tiny_model(encoding, double=True, **{**cfg, **kw})


def random_pairs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean/corrupt rows with the same pads, differing at positions 1 and 4."""
    g = torch.Generator().manual_seed(seed)
    real = torch.arange(POS)[None] < torch.tensor(LENGTHS)[:, None]
    clean = torch.randint(1, VOCAB, (len(LENGTHS), POS), generator=g) * real
    corrupt = clean.clone()
    for p in (1, 4):
        corrupt[:, p] = (
            clean[:, p] + torch.randint(1, VOCAB - 1, (len(LENGTHS),), generator=g) - 1
        ) % (VOCAB - 1) + 1
    assert bool((corrupt[:, [1, 4]] != clean[:, [1, 4]]).all())
    return clean, corrupt


def inputs(n: int = 24, seed: int = 0):
    """``(tokens, labels, pad mask)``: ``n`` rows of 8 positions, 5 to 8 of them real."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 9, (n,), generator=g)
    pad = torch.arange(8)[None] < lengths[:, None]
    tokens = torch.randint(1, 20, (n, 8), generator=g) * pad
    labels = torch.randint(0, 5, (n,), generator=g)
    return tokens, labels, pad


def class_metric(good: int, bad: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A scalar on our pooled logits ``[batch, n_classes]``: summed logit difference."""
    return lambda logits: (logits[:, good] - logits[:, bad]).sum()


def flags(model) -> tuple[bool, ...]:
    c = model.cfg
    return c.use_attn_result, c.use_split_qkv_input, c.use_attn_in, c.use_hook_mlp_in


@contextlib.contextmanager
def forks(model) -> Iterator[None]:
    """Our own switch-on of the per-head input forks and hook_mlp_in (restored after)."""
    saved = flags(model)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    try:
        yield
    finally:
        model.set_use_split_qkv_input(saved[1])
        model.set_use_hook_mlp_in(saved[3])


def cache_of(model, tokens, names: Callable[[str], bool] | None = None):
    with torch.no_grad():
        return model.run_with_cache(tokens, names_filter=names)[1]


def autograd_at(model, tokens, metric, names: list[str]) -> dict[str, torch.Tensor]:
    """d(sum of the per-row metrics)/d(activation) at each hook, through a zero tensor added
    there; rows are independent, so row b's gradient is that of ``metric`` on row b alone."""
    zeros: dict[str, torch.Tensor] = {}

    def add_zero(x, hook):
        zeros[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + zeros[hook.name]

    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(n, add_zero) for n in names])
        total = sum(metric(logits[b : b + 1]) for b in range(tokens.shape[0]))
        grads = torch.autograd.grad(total, [zeros[n] for n in names])
    return dict(zip(names, grads))

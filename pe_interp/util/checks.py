"""Input checks that the model, the trainer's evaluation and the probes share: token tensors,
class labels and finite weights. Each refuses with a one-line ``ValueError`` that names the
problem and the fix, before any work; each costs at most one host sync per call.

The probes' own checks (pad masks against tokens, layers, heads, examples, bootstrap counts)
build on these in :mod:`probes.common.inputs`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "check_bool",
    "check_choice",
    "check_float",
    "check_head_pairs",
    "check_int",
    "check_seed",
    "seed_problem",
    "SEED_LIMIT",
    "TOKEN_DTYPES",
    "check_finite_weights",
    "check_labels",
    "check_token_tensor",
    "finite_number",
    "nonfinite_weight",
    "type_name",
]

# what F.embedding takes after .long(); int8 is left out: it holds ids only up to 127
TOKEN_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


def type_name(x: Any) -> str:
    """``"numpy.ndarray"``, ``"list"``, ``"torch.float32 tensor"``: what a message calls a value."""
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor"
    kind = type(x)
    return (
        kind.__name__
        if kind.__module__ == "builtins"
        else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    )


def check_token_tensor(tokens: Any, what: str = "tokens") -> Tensor:
    """``tokens`` if it is a torch tensor of integer ids (of a dtype the embedding takes); the
    shape and the vocabulary are the model's to check (:meth:`HookedPETransformer.check_inputs`)."""
    if isinstance(tokens, np.ndarray):
        raise ValueError(
            f"{what} must be a torch tensor of token ids [batch, pos], got a numpy array "
            f"({tokens.dtype}); convert it with torch.from_numpy()"
        )
    if not isinstance(tokens, Tensor):
        raise ValueError(
            f"{what} must be a torch tensor of token ids [batch, pos], got {type_name(tokens)}; "
            "convert it with torch.tensor()"
        )
    if tokens.dtype not in TOKEN_DTYPES:
        hint = (
            "int8 holds ids only up to 127"
            if tokens.dtype == torch.int8
            else "token ids are whole numbers, not floats or booleans"
        )
        raise ValueError(
            f"{what} must be an integer tensor [batch, pos] (int64, int32, int16 or uint8), got "
            f"{tokens.dtype} ({hint}); pass {what}.long()"
        )
    return tokens


def check_labels(
    labels: Any,
    n_classes: int,
    n: int | None = None,
    *,
    what: str = "labels",
    device: torch.device | str | None = None,
) -> Tensor:
    """``labels`` as int64 class indices (on ``device``): a 1-D integer tensor, array or list of
    ``n`` values in ``0..n_classes - 1``. Float labels are refused rather than truncated."""
    if not isinstance(labels, Tensor):
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(
                f"{what} must be a 1-D tensor of class indices, got {type_name(labels)}"
            ) from None
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        why = (
            "booleans are not class indices"
            if labels.dtype == torch.bool
            else "a float label would be truncated"
        )
        raise ValueError(
            f"{what} must be integer class indices in 0..{n_classes - 1}, got {labels.dtype} "
            f"({why}); pass {what}.long() if they are whole numbers"
        )
    expected = "(n,)" if n is None else f"({n},)"
    if labels.ndim != 1 or (n is not None and labels.shape[0] != n):
        raise ValueError(
            f"{what} must have shape {expected}, one class per example, got {tuple(labels.shape)}"
        )
    labels = labels.to(device=device, dtype=torch.long) if device is not None else labels.long()
    bad = (labels < 0) | (labels >= n_classes)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{what} must be integers in 0..{n_classes - 1} (the model's classes), got "
            f"{int(labels[i])} at index {i}"
        )
    return labels


def nonfinite_weight(model: nn.Module) -> tuple[str, str] | None:
    """``(name, "NaN" | "inf")`` of the first parameter or floating buffer holding a non-finite
    value, or None; one host sync when every weight is finite."""
    tensors = [
        (k, t)
        for k, t in (*model.named_parameters(), *model.named_buffers())
        if t.is_floating_point()
    ]
    if not tensors:
        return None
    flags = torch.stack([torch.isfinite(t).all() for _, t in tensors])
    if bool(flags.all()):
        return None
    for (name, t), ok in zip(tensors, flags.tolist()):
        if not ok:
            return name, "NaN" if bool(torch.isnan(t).any()) else "inf"
    return None  # pragma: no cover - flags said otherwise


def check_finite_weights(model: nn.Module, who: str = "") -> None:
    """Refuse a model with a NaN or inf weight: its outputs would read like a real (null) result.
    The fix named fits the model: a run of ours is reloaded or retrained, a pretrained model
    (read through a bridge) loaded again from an intact file."""
    bad = nonfinite_weight(model)
    if bad is not None:
        prefix = f"{who}: " if who else ""
        why = (  # a pretrained model read through a bridge was never trained here
            "its file is damaged or the weights were edited: load it again (pe_interp.load) "
            "from an intact file"
            if getattr(model, "bridge", None) is not None
            else "its training diverged or the weights were edited: reload the run (load_run) "
            "or retrain it"
        )
        name = bad[0].replace("._original_component", "")
        raise ValueError(f"{prefix}the model has non-finite weights ({bad[1]} in {name}); {why}")


def check_token_ids(tokens: Any, d_vocab: int, n_ctx: int) -> Tensor:
    """``tokens`` as int64 ``[batch, pos]`` ids of a model with ``d_vocab`` ids and context ``n_ctx``."""
    check_token_tensor(tokens)
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ValueError(
            f"tokens must have shape [batch, pos] with pos >= 1, got {tuple(tokens.shape)}"
        )
    if tokens.shape[1] > n_ctx:
        raise ValueError(f"tokens: sequence length {tokens.shape[1]} exceeds n_ctx={n_ctx}")
    bad = (tokens < 0) | (tokens >= d_vocab)
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ValueError(
            f"tokens: id {tokens[tuple(where)].item()} at {tuple(where)} is outside the vocabulary "
            f"[0, {d_vocab})"
        )
    return tokens.long()  # int16/uint8 pass the check above, but F.embedding needs int64/int32


def check_pad_mask_tensor(tokens: Tensor, pad_mask: Any, pad_id: int) -> Tensor:
    """The pad mask of checked ``tokens`` (default ``tokens != pad_id``): bool, shaped like them,
    with a real token in every row."""
    if pad_mask is None:
        pad_mask = tokens != pad_id
    elif (
        not isinstance(pad_mask, Tensor)
        or pad_mask.shape != tokens.shape
        or pad_mask.dtype != torch.bool
    ):
        raise ValueError(
            f"pad_mask must be a bool tensor shaped like tokens {tuple(tokens.shape)}, got "
            f"{getattr(pad_mask, 'dtype', type(pad_mask).__name__)} {tuple(getattr(pad_mask, 'shape', ()))}"
        )
    if not bool(pad_mask.any(dim=1).all()):
        raise ValueError(
            f"pad_mask: row {(~pad_mask.any(dim=1)).nonzero()[0].item()} has no real token"
        )
    return pad_mask


def finite_number(value: Any) -> bool:
    """A real number (not bool) that is finite."""
    return (
        isinstance(value, int | float | np.integer | np.floating)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


# ---- config fields ------------------------------------------------------------------------------
# Seeds are whole numbers below 2**63: torch's generators take 64 bits, and the seeds derived from
# one (a seed plus a fixed offset) must stay within them.
SEED_LIMIT = 1 << 63


def seed_problem(value: Any) -> str | None:
    """Why ``value`` is no seed (module constant :data:`SEED_LIMIT`), or None."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return f"must be a whole number, got {value!r}"
    if not 0 <= value < SEED_LIMIT:
        return (
            f"must be in 0..{SEED_LIMIT - 1} (2**63 - 1: the generators take 64 bits, with room "
            f"for the seeds derived from it), got {value}"
        )
    return None


def check_seed(owner: str, name: str, value: Any) -> None:
    why = seed_problem(value)
    if why:
        raise ValueError(f"{owner}.{name} {why}")


def check_int(owner: str, name: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}.{name} must be an integer >= {low}, got {value!r}")


def check_float(
    owner: str, name: str, value: Any, low: float, high: float, high_open: bool = False
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and low <= value and (value < high if high_open else value <= high)
    if not ok:
        bracket = ")" if high_open else "]"
        raise ValueError(
            f"{owner}.{name} must be a number in [{low}, {high}{bracket}, got {value!r}"
        )


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def check_choice(owner: str, name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(
            f"{owner}.{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}"
        )


def check_head_pairs(
    owner: str, name: str, value: Any, n_layers: int, n_heads: int
) -> tuple[tuple[int, int], ...]:
    """Distinct ``(layer, head)`` pairs of the model, sorted (also from JSON lists or "L:H" text)."""
    try:
        pairs = [tuple(int(x) for x in (p.split(":") if isinstance(p, str) else p)) for p in value]
    except (TypeError, ValueError):
        raise ValueError(
            f"{owner}.{name} must be (layer, head) pairs, e.g. [[0, 1], [1, 3]] or 0:1 1:3; got "
            f"{value!r}"
        ) from None
    bad = [p for p in pairs if len(p) != 2 or not (0 <= p[0] < n_layers and 0 <= p[1] < n_heads)]
    if bad or len(set(pairs)) != len(pairs):
        what = (
            f"{bad[0]} is not a head of {n_layers} layers x {n_heads} heads"
            if bad
            else "a head is repeated"
        )
        raise ValueError(f"{owner}.{name}: {what}")
    return tuple(sorted(pairs))  # type: ignore[arg-type]

"""The probes' input checks, in one place: every probe refuses a bad input with a one-line
``ValueError`` that names the problem and the fix, before it does any work.

- :func:`check_examples`: tokens (a torch tensor of ids: the model's own :meth:`check_inputs`
  does the rest), a pad mask that fits the tokens (not one of another batch), and labels that
  are integer classes of the model (:func:`pe_interp.util.checks.check_labels`);
- :func:`check_finite_model`: no NaN or inf weight (one host sync), and :class:`FiniteWatch`,
  which watches a probe's logits without syncing and checks them once at the end;
- :func:`check_layers`, :func:`check_heads`, :func:`check_example`: indices in range;
- :func:`check_count` (bootstrap counts, batch sizes), :func:`check_fraction`,
  :func:`check_threshold`.

Only cheap checks: at most a few host syncs per probe call, none in inner loops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pe_interp.models.bridge.model import BridgedModel, is_bridge
from pe_interp.models.conformance import missing
from pe_interp.models.protocol import ProbeModel
from pe_interp.util.checks import (
    check_finite_weights,
    check_labels,
    check_token_tensor,
    finite_number,
    type_name,
)

__all__ = [
    "FiniteWatch",
    "check_count",
    "check_decomposable",
    "check_example",
    "check_examples",
    "check_finite_model",
    "check_fraction",
    "check_head",
    "check_heads",
    "check_labels",
    "check_layer",
    "check_layers",
    "check_model",
    "as_probe_model",
    "takes_probe_model",
    "check_pad_mask",
    "check_threshold",
    "check_token_tensor",
    "position_permutation",
]


def _p(who: str) -> str:
    return f"{who}: " if who else ""


def as_probe_model(model: Any, who: str = "") -> ProbeModel:
    """``model`` as the probes read it (:class:`~pe_interp.models.protocol.ProbeModel`): our own model
    or a :class:`~pe_interp.models.bridge.model.BridgedModel` as it is, a raw TransformerLens
    ``TransformerBridge`` wrapped as ``BridgedModel(bridge)`` (classes: every token of the
    vocabulary, so a label is the answer's token id); else a one-line ValueError naming what the
    model lacks."""
    if _is_raw_bridge(model):
        return BridgedModel(model)
    check_model(model, who)
    return model


def _is_raw_bridge(model: Any) -> bool:
    return not isinstance(model, BridgedModel) and is_bridge(model)


def check_model(model: Any, who: str = "") -> None:
    """A one-line ValueError unless ``model`` has every name of
    :class:`~pe_interp.models.protocol.ProbeModel` (a :class:`~pe_interp.HookedPETransformer` or a
    :class:`~pe_interp.models.bridge.model.BridgedModel`; :func:`as_probe_model` wraps a raw bridge)."""
    lacks = missing(model)
    if lacks:
        raise ValueError(
            f"{_p(who)}model must be a pe_interp HookedPETransformer, a TransformerBridge or a "
            f"BridgedModel, got {type(model).__name__}, which lacks {', '.join(lacks[:4])}"
            + (f" and {len(lacks) - 4} more" if len(lacks) > 4 else "")
        )


def takes_probe_model(fn: Callable) -> Callable:
    """Decorate a probe whose first argument is the model: it then takes any model
    :func:`as_probe_model` takes (a raw ``TransformerBridge`` too), checked before any work."""

    @functools.wraps(fn)
    def probe(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (as_probe_model(args[0], fn.__name__), *args[1:])
        elif "model" in kwargs:
            kwargs["model"] = as_probe_model(kwargs["model"], fn.__name__)
        return fn(*args, **kwargs)

    return probe


def check_decomposable(model: ProbeModel, who: str = "") -> None:
    """A one-line ValueError where ``model``'s encoding is not one of ours (a bridge's view of its
    architecture's positions, :class:`pe_interp.models.bridge.model.BridgeEncoding`): the logit decomposition
    splits our own encoding modules' terms."""
    enc = model.encoding
    if not enc.decomposes:
        raise ValueError(f"{_p(who)}{enc.not_ours()}")


def check_finite_model(model: ProbeModel, who: str = "") -> None:
    """A one-line ValueError when a weight of ``model`` is NaN or inf (see
    :func:`pe_interp.util.checks.check_finite_weights`)."""
    check_finite_weights(model, who)


def check_pad_mask(
    model: ProbeModel, tokens: Tensor, pad_mask: Tensor, who: str = "", what: str = "pad_mask"
) -> None:
    """``pad_mask`` (already shaped and typed like ``tokens``) must mark exactly the positions
    that hold a real token (pads hold ``cfg.pad_id``, which no real token uses): a mask of
    another batch of the same shape would otherwise be used silently."""
    pad_id = model.cfg.pad_id
    wrong = pad_mask == (tokens == pad_id)
    if bool(wrong.any()):
        row, pos = (int(i) for i in wrong.nonzero()[0])
        said = (
            "real, but it holds the pad id " + str(pad_id)
            if bool(pad_mask[row, pos])
            else f"padding, but it holds token {int(tokens[row, pos])}"
        )
        raise ValueError(
            f"{_p(who)}{what} does not fit the tokens: row {row}, position {pos} is marked {said} "
            f"(a pad mask of another batch?); pass the batch's own pad_mask, or None to derive it"
        )


def check_examples(
    model: ProbeModel,
    tokens: Any,
    labels: Any = None,
    pad_mask: Any = None,
    *,
    who: str = "",
    what: str = "tokens",
    label_name: str = "labels",
    mask_name: str = "pad_mask",
) -> tuple[Tensor, Tensor | None, Tensor]:
    """``(tokens, labels, pad_mask)`` checked and on the model's device: tokens as the model's
    forward accepts them (int64), the pad mask (default ``tokens != cfg.pad_id``) fitting them,
    labels (None passes) int64 classes of the model, one per row."""
    try:
        check_token_tensor(tokens, what)
        device = model.W_E.device
        tokens = tokens.to(device)
        if pad_mask is None:
            pad_mask = tokens != model.cfg.pad_id
        elif isinstance(pad_mask, Tensor):
            pad_mask = pad_mask.to(device)
        checked, _ = model.check_inputs(tokens, pad_mask)
        if not model.cfg.mask_padding and (
            not isinstance(pad_mask, Tensor)
            or pad_mask.shape != tokens.shape
            or pad_mask.dtype != torch.bool
        ):
            raise ValueError(
                f"pad_mask must be a bool tensor shaped like {what} {tuple(tokens.shape)}, "
                f"got {getattr(pad_mask, 'dtype', type_name(pad_mask))} "
                f"{tuple(getattr(pad_mask, 'shape', ()))}"
            )
    except ValueError as err:
        raise ValueError(f"{_p(who)}{err}") from None
    check_pad_mask(model, checked, pad_mask, who, mask_name)
    if labels is not None:
        try:
            labels = check_labels(
                labels, model.cfg.n_classes, checked.shape[0], what=label_name, device=device
            )
        except ValueError as err:
            raise ValueError(f"{_p(who)}{err}") from None
    return checked, labels, pad_mask


def check_count(value: Any, name: str, low: int = 0, who: str = "") -> int:
    """``value`` as an int when it is a whole number ``>= low`` (bootstrap counts, batch sizes)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        what = "a whole number" if low <= 0 else "a positive whole number"
        extra = " (0: none)" if name == "n_bootstrap" and low == 0 else ""
        raise ValueError(f"{_p(who)}{name} must be {what} >= {low}{extra}, got {value!r}")
    return int(value)


def check_fraction(value: Any, name: str, who: str = "", *, zero: bool = False) -> float:
    """``value`` as a float in ``(0, 1]`` (``[0, 1]`` with ``zero``)."""
    if not finite_number(value) or not ((value >= 0.0) if zero else (value > 0.0)) or value > 1.0:
        bound = "[0, 1]" if zero else "(0, 1]"
        raise ValueError(f"{_p(who)}{name} must be a number in {bound}, got {value!r}")
    return float(value)


def check_threshold(value: Any, name: str, who: str = "") -> float:
    """``value`` as a finite float ``>= 0``."""
    if not finite_number(value) or value < 0:
        raise ValueError(f"{_p(who)}{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _index(value: Any, size: int, name: str, who: str, has: str) -> int:
    if (
        isinstance(value, Tensor)
        and value.ndim == 0
        and not (value.is_floating_point() or value.dtype == torch.bool)
    ):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value < size:
        raise ValueError(f"{_p(who)}{name} {value!r} is out of range: {has} (0..{size - 1})")
    return int(value)


def _n_layers(model_or_n: ProbeModel | int) -> int:
    return int(model_or_n) if isinstance(model_or_n, int | np.integer) else model_or_n.cfg.n_layers


def check_layer(
    model_or_n_layers: ProbeModel | int, layer: Any, who: str = "", name: str = "layer"
) -> int:
    n = _n_layers(model_or_n_layers)
    return _index(layer, n, name, who, f"the model has {n} layers")


def check_head(
    model_or_n_heads: ProbeModel | int, head: Any, who: str = "", name: str = "head"
) -> int:
    n = (
        int(model_or_n_heads)
        if isinstance(model_or_n_heads, int | np.integer)
        else model_or_n_heads.cfg.n_heads
    )
    return _index(head, n, name, who, f"each layer has {n} heads")


def check_layers(
    model_or_n_layers: ProbeModel | int, layers: Iterable[Any] | None, who: str = ""
) -> list[int] | None:
    """Layer indices in ``0..n_layers - 1`` (None passes: every layer); a one-line error naming
    the first one out of range."""
    if layers is None:
        return None
    if isinstance(layers, int | np.integer):
        layers = [layers]
    return [check_layer(model_or_n_layers, layer, who) for layer in layers]


def check_heads(model: ProbeModel, heads: Iterable[Any], who: str = "") -> list[tuple[int, int]]:
    """``(layer, head)`` pairs of the model; a one-line error for a malformed or out-of-range one."""
    out = []
    for h in heads:
        if isinstance(h, str | Tensor) or not hasattr(h, "__len__") or len(h) != 2:
            raise ValueError(f"{_p(who)}a head is a (layer, head) pair, got {h!r}")
        out.append((check_layer(model, h[0], who), check_head(model, h[1], who)))
    return out


def check_example(example: Any, n: int, who: str = "", name: str = "example") -> int:
    """A row index of ``n`` examples."""
    return _index(example, n, name, who, f"there are {n} examples")


class FiniteWatch:
    """Watches the logits a probe computes without a host sync (a device-side flag), and checks
    them once at the end: finite weights can still overflow (bf16, huge inputs)."""

    def __init__(self) -> None:
        self.ok: Tensor | None = None

    def see(self, x: Tensor) -> Tensor:
        flag = torch.isfinite(x).all()
        self.ok = flag if self.ok is None else self.ok & flag
        return x

    def wrap(self, fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        """``fn(logits, ...)`` that also watches ``logits``."""

        def watched(logits: Tensor, *args: Any) -> Tensor:
            return fn(self.see(logits), *args)

        watched.__name__ = getattr(fn, "__name__", "metric")
        return watched

    def check(self, who: str = "", amp: bool = False) -> None:
        if self.ok is not None and not bool(self.ok):
            fix = (
                "run it without amp (float32)" if amp else "check the inputs and the weights' scale"
            )
            raise ValueError(
                f"{_p(who)}the model's logits are not finite (NaN or inf) on these inputs although "
                f"its weights are: an overflow; {fix}"
            )


def position_permutation(clean: Tensor, corrupt: Tensor) -> Tensor:
    """``σ [n, pos]`` with ``corrupt[b, σ[b, i]] == clean[b, i]``: each clean token's position in
    its counterfactual row (equal tokens matched in order). A one-line error where a row of
    ``corrupt`` is not a permutation of its clean row."""
    if clean.shape != corrupt.shape:
        raise ValueError(
            f"clean and counterfactual tokens must have one shape, got {tuple(clean.shape)} and "
            f"{tuple(corrupt.shape)}"
        )
    order_clean = torch.sort(clean, dim=1, stable=True)
    order_corrupt = torch.sort(corrupt, dim=1, stable=True)
    bad = (order_clean.values != order_corrupt.values).any(dim=1)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(
            f"row {row}: the counterfactual is not the same tokens moved (a position-only "
            "counterfactual, task.counterfactuals(n, kind='position'), is needed)"
        )
    sigma = torch.empty_like(clean)
    sigma.scatter_(1, order_clean.indices, order_corrupt.indices)
    return sigma

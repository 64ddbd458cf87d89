"""Held-out evaluation: accuracy and mean cross-entropy of a model on a task batch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pe_interp.util import hardware
from pe_interp.util.checks import check_finite_weights, check_labels
from pe_interp.util.modes import eval_mode

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(
    model, batch, batch_size: int = 1024, amp: bool = False, ignore_index: int | None = None
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on a task batch (eval mode, restored after).

    Rows whose label is ``ignore_index`` count in neither (the authors' task-2 protocol)."""
    if len(batch) == 0:
        raise ValueError("evaluate: the batch is empty (need at least 1 example)")
    check_finite_weights(model, "evaluate")
    try:
        check_labels(batch.labels, model.cfg.n_classes, len(batch), what="batch.labels")
    except ValueError as err:
        raise ValueError(f"evaluate: {err}") from None
    device = model.W_E.device
    correct, loss_sum, counted = 0, 0.0, 0
    with eval_mode(model):
        for i in range(0, len(batch), batch_size):
            part = batch[i : i + batch_size].to(device)
            with autocast_for(device, amp):
                logits = model(part.tokens, part.pad_mask).float()
            keep = part.labels != ignore_index if ignore_index is not None else slice(None)
            logits, labels = logits[keep], part.labels[keep]
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(-1) == labels).sum().item()
            counted += len(labels)
    if counted == 0:
        raise ValueError(f"evaluate: every label is the ignored class {ignore_index}")
    if not math.isfinite(loss_sum):  # finite weights, yet the logits overflowed
        fix = "evaluate without amp (float32)" if amp else "check the inputs and the weights' scale"
        raise ValueError(
            f"evaluate: the loss is not finite ({loss_sum}) although the weights are: the logits "
            f"overflow; {fix}"
        )
    return {"acc": correct / counted, "loss": loss_sum / counted}


def autocast_for(device: torch.device, amp: bool):
    """bf16 autocast when ``amp`` and the device runs bf16 natively (:mod:`pe_interp.util.hardware`)."""
    return hardware.autocast(device, amp)

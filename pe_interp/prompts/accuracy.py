"""A model's accuracy on a prompt set: its greedy next token at each prompt's last real token
against the label (the answer's first token), batched.

``model``: a TransformerLens ``TransformerBridge``, a :class:`~pe_interp.models.bridge.model.BridgedModel` with
``answers=None`` (classes are token ids), or a Hugging Face causal language model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pe_interp.models.bridge.hf_arch import read_answers
from pe_interp.prompts.batch import PromptSet
from pe_interp.prompts.vocab import BosPolicy, context_limit, model_vocab_size


@dataclass(frozen=True, eq=False)
class FamilyAccuracy:
    """``correct`` of ``n`` prompts of ``family`` answered right (greedy next token == label);
    ``predictions`` ``[n]`` the greedy tokens; ``n_multi_token`` answers scored on their first
    token; ``bos`` the prompts' BOS policy."""

    family: str
    correct: int
    n: int
    predictions: Tensor
    n_multi_token: int
    bos: BosPolicy

    @property
    def accuracy(self) -> float:
        """``correct / n`` (0.0 for no prompts)."""
        return self.correct / self.n if self.n else 0.0

    def summary(self) -> str:
        """One line: ``"induction: 58 of 64 correct (0.906); BOS '<s>' (id 1) prepended"``, with
        ``"answers scored on their first token"`` where any answer is multi-token."""
        line = f"{self.family}: {self.correct} of {self.n} correct ({self.accuracy:.3f}); {self.bos.describe()}"
        if self.n_multi_token:
            line += (
                f"; answers scored on their first token ({self.n_multi_token} of {self.n} are "
                "multi-token)"
            )
        return line

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-able fields (without the predictions)."""
        return {
            "family": self.family,
            "correct": self.correct,
            "n": self.n,
            "accuracy": self.accuracy,
            "n_multi_token": self.n_multi_token,
            "scored_on_first_token": self.n_multi_token > 0,
            "bos": self.bos.to_dict(),
        }


def family_accuracy(model: Any, prompts: PromptSet, *, batch_size: int = 32) -> FamilyAccuracy:
    """The model's greedy next-token accuracy on ``prompts`` (module docstring), ``batch_size``
    prompts a forward. One-line ValueErrors where the prompts do not fit the model (longer than
    its context or sliding window, ids outside its vocabulary, another pad id) or the model is
    none of the kinds above."""
    if not isinstance(prompts, PromptSet):
        raise ValueError(f"family_accuracy takes a PromptSet, got {type(prompts).__name__}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    forward = _forward_of(model, prompts)
    check_fits(model, prompts)
    device = _device(model)
    # rows in order of length, so a batch of equal lengths runs without padding
    order = torch.argsort(prompts.lengths, stable=True)
    predicted = torch.zeros(len(prompts), dtype=torch.long)
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            rows = order[start : start + batch_size]
            part = prompts[rows]
            width = int(part.lengths.max())
            tokens = part.tokens[:, :width].to(device)
            mask = part.pad_mask[:, :width].to(device)
            predicted[rows] = forward(tokens, mask).argmax(-1).cpu()
    return FamilyAccuracy(
        family=prompts.family,
        correct=int((predicted == prompts.labels).sum()),
        n=len(prompts),
        predictions=predicted,
        n_multi_token=prompts.n_multi_token,
        bos=prompts.bos,
    )


def check_fits(model: Any, prompts: PromptSet) -> None:
    """A one-line ValueError where ``prompts`` are longer than ``model``'s context or sliding
    window (:func:`~pe_interp.prompts.vocab.context_limit`) or hold ids outside its vocabulary."""
    limit, what = context_limit(model)
    longest = int(prompts.lengths.max()) if len(prompts) else 0
    if limit is not None and longest > limit:
        raise ValueError(
            f"{prompts.family}: prompts of up to {longest} tokens are longer than the model's {what} "
            f"of {limit}"
        )
    vocab = model_vocab_size(model)
    if vocab is not None and len(prompts):
        top = max(int(prompts.tokens[prompts.pad_mask].max()), int(prompts.labels.max()))
        if top >= vocab:
            raise ValueError(
                f"{prompts.family}: token id {top} is outside the model's vocabulary ({vocab}); "
                "were the prompts built with this model's tokenizer?"
            )


def format_accuracies(results: Iterable[FamilyAccuracy]) -> str:
    """Each result's :meth:`FamilyAccuracy.summary`, one a line."""
    return "\n".join(r.summary() for r in results)


def _forward_of(model: Any, prompts: PromptSet) -> Any:
    """``(tokens, mask) -> [batch, vocab]`` next-token logits at each row's last real token."""
    padded = not bool(prompts.pad_mask.all())
    if hasattr(model, "bridge") and hasattr(model, "check_inputs"):  # a BridgedModel
        if getattr(model, "answers", None) is not None:
            raise ValueError(
                "family_accuracy needs the bridge's whole vocabulary as classes: BridgedModel(bridge), "
                "without answers"
            )
        if padded and model.cfg.pad_id != prompts.pad_id:
            raise ValueError(
                f"{prompts.family}: the prompts are padded with id {prompts.pad_id} and the model with "
                f"{model.cfg.pad_id}: build it as BridgedModel(bridge, pad_id=prompts.pad_id)"
            )
        return lambda tokens, mask: model(tokens, mask)
    if hasattr(model, "original_model") and hasattr(model, "run_with_hooks"):  # a bridge

        def bridge_forward(tokens: Tensor, mask: Tensor) -> Tensor:
            kwargs = {} if bool(mask.all()) else {"attention_mask": mask.long()}
            return read_answers(model(tokens, **kwargs), mask, None)

        return bridge_forward
    if isinstance(model, torch.nn.Module) and hasattr(model, "config"):  # a Hugging Face model

        def hf_forward(tokens: Tensor, mask: Tensor) -> Tensor:
            if bool(mask.all()):  # no pads: the last position's logits only, where the model can
                try:
                    return model(input_ids=tokens, logits_to_keep=1).logits[:, -1]
                except TypeError:
                    pass
            logits = model(input_ids=tokens, attention_mask=mask.long()).logits
            return read_answers(logits, mask, None)

        return hf_forward
    raise ValueError(
        "family_accuracy takes a TransformerBridge, a BridgedModel or a Hugging Face causal language "
        f"model, got {type(model).__name__}"
    )


def _device(model: Any) -> torch.device:
    try:
        return next(iter(model.parameters())).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


__all__ = ["FamilyAccuracy", "check_fits", "family_accuracy", "format_accuracies"]

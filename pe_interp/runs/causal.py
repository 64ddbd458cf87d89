"""Whether a saved model attends causally, whatever its config claims: the probes read a causal
language model, and a bridge masks attention itself, so a model that attends both ways would be
probed as another model. Checked on a one-layer miniature built from its config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from pe_interp.runs.checkpoint import CheckpointError

CAUSAL_TOLERANCE = 1e-4  # of the logits' scale: a causal model's earlier rows move by rounding only


# A miniature of the model for the causality check: its attention as the config builds it, one
# layer, a small vocabulary and MLP (neither decides where attention looks).
MINIATURE = {"num_hidden_layers": 1, "vocab_size": 256}


MLP_WIDTHS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")


MINIATURE_FLAG = "_pe_interp_miniature"


def check_attends_causally(path: Path, where: Any, n_tokens: int = 8) -> None:
    """A one-line CheckpointError, before any forward of the model, unless it attends causally as
    ``transformers`` runs it, whatever its config claims (a ``LlamaForCausalLM`` saved with
    ``"is_causal": false`` attends both ways, and the bridge, which masks attention itself, would
    probe another model than the one saved). A miniature of the model is built from its config
    (:data:`MINIATURE`, random weights) and run on two rows of tokens that differ only in the
    last: the logits at every earlier position must not move. An architecture whose miniature
    cannot be built is left to :func:`check_causal` (its config's names)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(str(path))
        small = copy.deepcopy(config)
        for name, value in MINIATURE.items():
            setattr(small, name, min(value, getattr(config, name, value)))
        for name in MLP_WIDTHS:
            if isinstance(getattr(small, name, None), int):
                setattr(small, name, min(64, getattr(small, name)))
        if isinstance(getattr(small, "layer_types", None), list):
            small.layer_types = small.layer_types[:1]
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(getattr(small, name, None), int) and getattr(small, name) >= 256:
                setattr(small, name, None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(small).eval()
            setattr(model, MINIATURE_FLAG, True)  # its forward is a check's, not the model's
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() >= 2:
                        p.normal_(0.0, 0.5)
            vocab = int(small.vocab_size)
            n = max(2, min(n_tokens, int(getattr(small, "max_position_embeddings", n_tokens))))
            x = torch.randint(0, vocab, (1, n))
            y = x.clone()
            y[0, -1] = (x[0, -1] + 1) % vocab
            with torch.no_grad():
                logits = model(torch.cat([x, y])).logits.float()
    except Exception:  # noqa: BLE001 - a miniature this architecture cannot make: names only
        return
    finally:
        hf_logging.set_verbosity(level)
    moved = float((logits[0, :-1] - logits[1, :-1]).abs().max())
    scale = max(1.0, float(logits[:, :-1].abs().max()))
    if moved > CAUSAL_TOLERANCE * scale:
        claims = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        causal = getattr(config, "is_causal", None)
        said = f", is_causal {causal}" if causal is not None else ""
        raise CheckpointError(
            f"{where}: its attention is not causal (a token moves the logits at the positions "
            f"before it) although its config names {claims}{said}; the probes read causal "
            "language models"
        )


def check_causal(path: Path, given: Any = None) -> None:
    """A one-line CheckpointError unless the saved model is a causal language model: its config
    names an architecture that ``transformers`` lists as causal for its model type, and it is no
    encoder-decoder (an encoder-only or masked model attends both ways, so no probe's reading of
    a last position means what it means in a causal model)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((path / "config.json").read_text())
    where, names = given or path, config.get("architectures") or []
    causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type"))
    if config.get("is_encoder_decoder"):
        raise CheckpointError(
            f"{where}: an encoder-decoder model ({', '.join(names) or config.get('model_type')}); "
            "the probes read causal language models"
        )
    if names and not any(n == causal or n.endswith("ForCausalLM") for n in names):
        raise CheckpointError(
            f"{where}: {', '.join(names)} is not a causal language model (an encoder-only or "
            "masked model attends both ways); the probes read causal language models"
        )


__all__ = [
    "CAUSAL_TOLERANCE",
    "MINIATURE",
    "MINIATURE_FLAG",
    "MLP_WIDTHS",
    "check_attends_causally",
    "check_causal",
]

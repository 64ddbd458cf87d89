"""The model of a run, ours or a Hugging Face architecture (``ModelConfig.arch``,
``pe-interp train --arch``): built for training, saved as a Hugging Face directory beside the
run's own files (``RUN/hf/``: ``save_pretrained`` of the weights, its config and a word-level
tokenizer), and read back for probing as a :class:`~pe_interp.models.bridge.model.BridgedModel` over a
TransformerLens bridge that shares the trained weights (so a snapshot is probed like the end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HF_DIR = "hf"  # RUN/hf/: the run as a saved Hugging Face model


def build_model(cfg: Any) -> Any:
    """The model ``cfg`` describes: :class:`~pe_interp.HookedPETransformer`, or an
    :class:`~pe_interp.models.bridge.hf_arch.ArchClassifier` when ``cfg.arch`` is set."""
    if cfg.arch is None:
        from pe_interp.models.hooked.model import HookedPETransformer

        return HookedPETransformer(cfg)
    from pe_interp.models.bridge.hf_arch import ArchClassifier

    return ArchClassifier(cfg)


def save_hf(run_dir: str | Path, model: Any, weights: bool = True) -> Path | None:
    """``RUN/hf/`` of an architecture's run (its config and tokenizer; ``weights``: and its weights)."""
    if getattr(model.cfg, "arch", None) is None:
        return None
    return model.save_dir(Path(run_dir) / HF_DIR, weights=weights)


def probe_model(model: Any, run_dir: str | Path, device: str = "cpu") -> Any:
    """What the probes read: the model itself, or for an architecture a
    :class:`~pe_interp.models.bridge.model.BridgedModel` over its trained weights (``RUN/hf/`` gives the
    bridge its config and tokenizer)."""
    if getattr(model.cfg, "arch", None) is None:
        return model
    from pe_interp.models.bridge.hf_arch import bridged
    from pe_interp.models.bridge.model import BridgedModel

    config_dir = Path(run_dir) / HF_DIR
    if not (config_dir / "config.json").is_file():
        save_hf(run_dir, model, weights=False)
    return BridgedModel(
        bridged(model, config_dir, device), answers=model.answers.cpu(), pad_id=model.cfg.pad_id
    ).eval()


__all__ = ["HF_DIR", "build_model", "probe_model", "save_hf"]

"""pe-interp: hooked transformers with pluggable positional encodings, and the probes to study
how position shapes attention (a reimplementation of arXiv 2505.13027)."""

from pe_interp._version import __version__
from pe_interp.api import train
from pe_interp.config.model import ModelConfig, TrainConfig
from pe_interp.encodings import EncodingSpec, available_encodings, register_encoding
from pe_interp.models.hooked.model import HookedPETransformer
from pe_interp.runs.checkpoint import Run, load_run
from pe_interp.runs.load import Origin, load
from pe_interp.runs.snapshots import snapshot_steps
from pe_interp.training.trainer import Trainer, evaluate

__all__ = [
    "EncodingSpec",
    "HookedPETransformer",
    "ModelConfig",
    "Run",
    "TrainConfig",
    "Trainer",
    "evaluate",
    "load",
    "load_run",
    "Origin",
    "train",
    "__version__",
    "available_encodings",
    "register_encoding",
    "snapshot_steps",
]

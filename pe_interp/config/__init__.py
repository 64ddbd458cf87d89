"""Configs: the model (:mod:`~pe_interp.config.model`), training (:mod:`~pe_interp.config.train`),
their checks, and the named presets (:mod:`~pe_interp.config.presets`)."""

from pe_interp.config.model import ModelConfig
from pe_interp.config.train import TrainConfig

__all__ = ["ModelConfig", "TrainConfig"]

"""The configurable Transformer of "Attention Is All You Need", its data and its Lightning module."""

from lightning_modules.config import (DataConfig, EvalConfig, RunConfig, ScaleConfig, TrainConfig,
                                      TransformerConfig)
from lightning_modules.transformer import Transformer, count_parameters

__all__ = ["DataConfig", "EvalConfig", "RunConfig", "ScaleConfig", "TrainConfig", "Transformer",
           "TransformerConfig", "count_parameters"]

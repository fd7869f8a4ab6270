"""Decoda's engine: model loading, KV cache, batched runner, logits processors, strategies.

The public API for the HTTP layer is re-exported here; nothing in this package imports fastapi.
"""

from decoding.client_api import (
    EngineClient,
    EngineUnavailableError,
    LoraBusyError,
    LoraLimitError,
    QueueFullError,
    ServedModel,
)
from decoding.config import EngineConfig
from decoding.outputs import FinishReason, RequestOutput, SequenceDelta, TokenLogprob, TopLogprob
from decoding.params import GenerationParams, ParameterError, Strategy, resolve_strategy
from decoding.params.model_checks import ModelFacts, check_against_model

__all__ = [
    "EngineClient",
    "EngineConfig",
    "EngineUnavailableError",
    "FinishReason",
    "GenerationParams",
    "LoraBusyError",
    "LoraLimitError",
    "ModelFacts",
    "ParameterError",
    "QueueFullError",
    "RequestOutput",
    "SequenceDelta",
    "ServedModel",
    "Strategy",
    "TokenLogprob",
    "TopLogprob",
    "check_against_model",
    "resolve_strategy",
]

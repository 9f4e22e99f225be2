"""The inference engine: model loading, scheduling and continuous batching. Imports no Celery."""

from __future__ import annotations

from workers.engine.config import PLACEHOLDER_MODEL, EngineConfig
from workers.engine.types import (
    Engine,
    EngineError,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    RequestError,
    SamplingParams,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "FatalEngineError",
    "GenerationRequest",
    "GenerationResult",
    "RequestError",
    "SamplingParams",
    "build_engine",
]


def build_engine(config: EngineConfig) -> Engine:
    """The engine for config.model (not started)."""
    if config.model == PLACEHOLDER_MODEL:
        from workers.engine.placeholder import PlaceholderEngine

        return PlaceholderEngine(config)
    raise NotImplementedError(f"model {config.model!r}: the transformers engine is not built yet")

"""The inference engine: model loading, scheduling and continuous batching. Imports no Celery.

build_engine(config) returns the placeholder echo engine for PLACEHOLDER_MODEL and the transformers
continuous-batching engine (workers/engine/continuous.py) for every other model id. Both run the same
loop (core.py: each step scheduler.py plans, an executor runs the forward passes, output.py applies
the tokens) and differ only in the executor (executor.py's Protocol: where other backends plug in).
The worker:

    engine = build_engine(EngineConfig(model=..., on_step=observe_step, on_fatal=exit_soon))
    engine.start()                      # loads, converts on first use, warms up; FatalEngineError if it can't
    future = engine.submit(GenerationRequest(...))
    result = future.result()            # GenerationResult, or raises RequestError(ErrorType..., message)
    engine.cancel(request_id); engine.shutdown(timeout)

Metrics hooks: EngineConfig.on_step(StepStats) after every engine step (batch_size, tokens,
prefill_tokens, duration_s, first_token_ms from submit); engine.stats() -> EngineStats
counters; every GenerationResult carries queued_ms, time_to_first_token_ms and batch_size.
Fatal errors: fatal_error is set and EngineConfig.on_fatal is called once, before anything else (a
worker hands its jobs back and exits non-zero there); then every held future fails with the
FatalEngineError (both engines; EngineConfig.fault_file injects one in tests).
"""

from __future__ import annotations

from workers.engine import quiet
from workers.engine.config import PLACEHOLDER_MODEL, EngineConfig
from workers.engine.types import (
    Engine,
    EngineError,
    EngineStats,
    ErrorType,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    RequestError,
    SamplingParams,
    StepStats,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "ErrorType",
    "FatalEngineError",
    "GenerationRequest",
    "GenerationResult",
    "RequestError",
    "SamplingParams",
    "StepStats",
    "build_engine",
]

quiet.install()  # before any engine module imports torch (workers/engine/quiet.py)


def build_engine(config: EngineConfig) -> Engine:
    """The engine for config.model (not started)."""
    if config.model == PLACEHOLDER_MODEL:
        from workers.engine.placeholder import PlaceholderEngine

        return PlaceholderEngine(config)
    # Imported here so the placeholder path (and the API tier's tests) never pay for torch.
    from workers.engine.continuous import TransformersEngine

    return TransformersEngine(config)

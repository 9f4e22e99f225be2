"""The inference engine: model loading, scheduling and continuous batching. Imports no Celery.

Layout: this package is the engine's contract and loop, whatever runs the forward passes: the
types a worker hands in and gets back (types.py, config.py), the loop (core.py: each step
scheduler.py plans, an executor runs the forward passes, output.py applies the tokens), the
Executor seam (executor.py's Protocols), LocalEngine (local.py: a request's text turned into a
Sequence, run by that loop over any executor), and what more than one backend reads of a model
(gguf.py, tokenizer.py, prompts.py). sampling/ is token choice, shared by every backend with
logits. Each backend is a subpackage that imports no other: llamacpp/ and torch/ (named as
EngineConfig.backend names them: llama.cpp's kernels, transformers) and placeholder/ (an echo).

build_engine(config) returns the placeholder echo engine for PLACEHOLDER_MODEL and LocalEngine for
every other model id, its forward passes run by one of two backends (EngineConfig.backend, resolved
by `choose_backend`): llama.cpp's kernels (llamacpp/executor.py) for a GGUF model on CPU (no
dequantized fp32 copy of the weights, and faster decoding at low concurrency: docs/performance.md's
"Engine backends"), or transformers (torch/executor.py) for safetensors/AWQ checkpoints, GPUs, and
any model when llama-cpp-python is not installed.
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
FatalEngineError (the local and the placeholder engine alike; EngineConfig.fault_file injects one
in tests).
"""

from __future__ import annotations

import logging
from pathlib import Path

from workers.engine import quiet
from workers.engine.config import DEFAULT_MODEL, PLACEHOLDER_MODEL, EngineConfig
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
    "choose_backend",
]

quiet.install()  # before any engine module imports torch (workers/engine/quiet.py)


def build_engine(config: EngineConfig) -> Engine:
    """The engine for config.model (not started)."""
    if config.model == PLACEHOLDER_MODEL:
        from workers.engine.placeholder.engine import PlaceholderEngine

        return PlaceholderEngine(config)
    # Imported here so the placeholder path (and the API tier's tests) never pay for torch.
    from workers.engine.local import LocalEngine

    if choose_backend(config) == "llamacpp":
        from workers.engine.llamacpp.executor import LlamaCppExecutor

        return LocalEngine(config, executor=LlamaCppExecutor(config))
    return LocalEngine(config)


def choose_backend(config: EngineConfig) -> str:
    """ "torch" or "llamacpp" for config (see EngineConfig.backend): auto takes llama.cpp for a GGUF
    model on CPU when llama-cpp-python is installed; llamacpp on anything else is a configuration error."""
    gguf = config.model == DEFAULT_MODEL or Path(config.model).suffix == ".gguf"
    if config.backend == "torch":
        return "torch"
    if config.backend == "llamacpp":
        if not gguf or config.device != "cpu":
            message = f"backend llamacpp runs GGUF models on cpu; got {config.model!r} on {config.device}"
            raise FatalEngineError(message)
        return "llamacpp"
    if not (gguf and config.device == "cpu"):
        return "torch"
    from workers.engine.llamacpp.model import available

    if available():
        return "llamacpp"
    logging.getLogger(__name__).warning("llama-cpp-python is not installed: the GGUF model runs on torch")
    return "torch"

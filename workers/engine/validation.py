"""Request validation before a request reaches the engine loop: a bad one fails alone, at submit."""

from __future__ import annotations

from workers.engine.types import MAX_TOP_LOGPROBS, ErrorType, GenerationRequest, RequestError, SamplingParams


def validate_params(request: GenerationRequest) -> None:
    """RequestError (`invalid_request`) when the request's shape or sampling parameters are out of bounds."""
    params = request.params
    if (request.prompt is None) == (request.messages is None):
        raise RequestError(ErrorType.INVALID_REQUEST, "give exactly one of prompt and messages")
    if request.messages is not None and request.template == "none":
        message = "template 'none' applies to a prompt; messages always use the chat template"
        raise RequestError(ErrorType.INVALID_REQUEST, message)
    least = 0 if params.prompt_logprobs is not None else 1  # 0 tokens: scoring the prompt only
    if params.max_tokens < least:
        raise RequestError(
            ErrorType.INVALID_REQUEST, f"max_tokens must be >= {least}, got {params.max_tokens}"
        )
    if params.n < 1 or (params.best_of is not None and params.best_of < params.n):
        raise RequestError(
            ErrorType.INVALID_REQUEST, f"n ({params.n}) must be >= 1 and <= best_of ({params.best_of})"
        )
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
            raise RequestError(
                ErrorType.INVALID_REQUEST, f"{name} must be in [0, {MAX_TOP_LOGPROBS}], got {value}"
            )
    if params.temperature < 0:
        raise RequestError(ErrorType.INVALID_REQUEST, f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise RequestError(ErrorType.INVALID_REQUEST, f"top_p must be in (0, 1], got {params.top_p}")
    if any(not stop for stop in params.stop):
        raise RequestError(ErrorType.INVALID_REQUEST, "stop strings must not be empty")
    _validate_adjustments(params)


def _validate_adjustments(params: SamplingParams) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= getattr(params, name) <= 2.0:
            raise RequestError(
                ErrorType.INVALID_REQUEST, f"{name} must be in [-2, 2], got {getattr(params, name)}"
            )
    if not 0 < params.repetition_penalty <= 2.0:
        raise RequestError(
            ErrorType.INVALID_REQUEST,
            f"repetition_penalty must be in (0, 2], got {params.repetition_penalty}",
        )
    if not 0 <= params.min_tokens <= params.max_tokens:
        message = f"min_tokens ({params.min_tokens}) must be in [0, max_tokens ({params.max_tokens})]"
        raise RequestError(ErrorType.INVALID_REQUEST, message)
    if any(not -100.0 <= bias <= 100.0 for _, bias in params.logit_bias):
        raise RequestError(ErrorType.INVALID_REQUEST, "logit_bias values must be in [-100, 100]")


def check_vocabulary(params: SamplingParams, vocab: int) -> None:
    """RequestError when logit_bias names a token outside a vocabulary of `vocab` tokens."""
    bad = [token for token, _ in params.logit_bias if not 0 <= token < vocab]
    if bad:
        message = f"logit_bias names token {bad[0]}, outside this model's vocabulary (0..{vocab - 1})"
        raise RequestError(ErrorType.INVALID_REQUEST, message)

"""Request validation before a request reaches the engine loop: a bad one fails alone, at submit.

Each parameter's bounds are the spec's (shared/jobspec.py): SamplingParams checks them as it is
built, so none is declared again here. What is left is the request's shape, the rules across
fields that depend on max_tokens (the spec's length_error, which the API asks too), and what
depends on the model (its vocabulary).
"""

from __future__ import annotations

from workers.engine.types import ErrorType, GenerationRequest, RequestError, SamplingParams


def validate_params(request: GenerationRequest) -> None:
    """RequestError (`invalid_request`) when the request's shape, or its max_tokens against its
    other parameters, is not one the engine can run."""
    params = request.params
    if (request.prompt is None) == (request.messages is None):
        raise RequestError(ErrorType.INVALID_REQUEST, "give exactly one of prompt and messages")
    if request.messages is not None and request.template == "none":
        message = "template 'none' applies to a prompt; messages always use the chat template"
        raise RequestError(ErrorType.INVALID_REQUEST, message)
    error = params.length_error(params.max_tokens)
    if error is not None:
        raise RequestError(ErrorType.INVALID_REQUEST, error[1])


def check_vocabulary(params: SamplingParams, vocab: int) -> None:
    """RequestError when logit_bias names a token outside a vocabulary of `vocab` tokens."""
    bad = [token for token in params.logit_bias if not 0 <= token < vocab]
    if bad:
        message = f"logit_bias names token {bad[0]}, outside this model's vocabulary (0..{vocab - 1})"
        raise RequestError(ErrorType.INVALID_REQUEST, message)

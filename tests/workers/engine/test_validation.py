"""workers/engine/validation.py: a request out of bounds fails at submit with `invalid_request`
and a message naming the field and the value; one in bounds passes."""

from __future__ import annotations

from typing import Any

import pytest

from workers.engine.types import ErrorType, GenerationRequest, RequestError, SamplingParams
from workers.engine.validation import check_vocabulary, validate_params


def _request(
    prompt: str | None = "hi", messages: Any = None, template: Any = None, **params: Any
) -> GenerationRequest:
    return GenerationRequest("r1", SamplingParams(**({"max_tokens": 4} | params)), prompt, messages, template)


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (_request(max_tokens=0), "max_tokens must be >= 1, got 0"),
        (_request(temperature=-0.1), "temperature must be >= 0, got -0.1"),
        (_request(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
        (_request(top_p=1.5), "top_p"),
        (_request(stop=("",)), "stop strings must not be empty"),
        (_request(n=0), "n (0) must be >= 1"),
        (_request(n=3, best_of=2), "n (3) must be >= 1 and <= best_of (2)"),
        (_request(logprobs=21), "logprobs must be in [0, 20], got 21"),
        (_request(prompt_logprobs=-1), "prompt_logprobs must be in [0, 20], got -1"),
        (_request(presence_penalty=2.5), "presence_penalty must be in [-2, 2], got 2.5"),
        (_request(frequency_penalty=-3.0), "frequency_penalty must be in [-2, 2], got -3.0"),
        (_request(repetition_penalty=0.0), "repetition_penalty must be in (0, 2], got 0.0"),
        (_request(min_tokens=5), "min_tokens (5) must be in [0, max_tokens (4)]"),
        (_request(logit_bias=((3, 101.0),)), "logit_bias values must be in [-100, 100]"),
        (_request(prompt=None), "exactly one of prompt and messages"),
        (_request(messages=[{"role": "user", "content": "hi"}]), "exactly one of prompt and messages"),
        (_request(None, [{"role": "user", "content": "hi"}], "none"), "template 'none' applies to a prompt"),
    ],
)
def test_each_bad_field_is_named(request_: GenerationRequest, named: str) -> None:
    with pytest.raises(RequestError) as caught:
        validate_params(request_)
    assert caught.value.type is ErrorType.INVALID_REQUEST
    assert named in caught.value.message


def test_requests_in_bounds_pass() -> None:
    validate_params(_request())
    validate_params(_request(max_tokens=0, prompt_logprobs=1))  # scoring the prompt only
    validate_params(_request(temperature=2.0, top_p=1.0, n=2, best_of=4, logprobs=20, min_tokens=4,
                             logit_bias=((0, -100.0), (1, 100.0)), repetition_penalty=2.0))  # fmt: skip
    validate_params(_request(None, [{"role": "user", "content": "hi"}], "chat"))


def test_logit_bias_must_name_tokens_of_the_vocabulary() -> None:
    check_vocabulary(SamplingParams(max_tokens=1, logit_bias=((0, 1.0), (99, 1.0))), vocab=100)
    with pytest.raises(RequestError, match=r"logit_bias names token 100, outside .* \(0..99\)"):
        check_vocabulary(SamplingParams(max_tokens=1, logit_bias=((100, 1.0),)), vocab=100)

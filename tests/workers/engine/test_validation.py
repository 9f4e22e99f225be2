"""Bounds are the spec's (shared/jobspec.py): a SamplingParams out of them cannot be built, and the
error names the field and the bound. What validation.py adds fails at submit with
`invalid_request`: the request's shape, max_tokens against the other fields, the vocabulary."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from workers.engine.types import ErrorType, GenerationRequest, RequestError, SamplingParams
from workers.engine.validation import check_vocabulary, validate_params


def _request(
    prompt: str | None = "hi", messages: Any = None, template: Any = None, **params: Any
) -> GenerationRequest:
    return GenerationRequest("r1", SamplingParams(**({"max_tokens": 4} | params)), prompt, messages, template)


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("max_tokens", -1, "greater than or equal to 0"),
        ("temperature", -0.1, "greater than or equal to 0"),
        ("top_p", 0.0, "greater than 0"),
        ("top_p", 1.5, "less than or equal to 1"),
        ("stop", ("",), "at least 1 character"),
        ("n", 0, "greater than or equal to 1"),
        ("best_of", 2, "best_of (2) must be at least n (3)"),
        ("logprobs", 21, "less than or equal to 20"),
        ("prompt_logprobs", -1, "greater than or equal to 0"),
        ("presence_penalty", 2.5, "less than or equal to 2"),
        ("frequency_penalty", -3.0, "greater than or equal to -2"),
        ("repetition_penalty", 0.0, "greater than 0"),
        ("logit_bias", {3: 101.0}, "less than or equal to 100"),
        ("ignore_eos", "sometimes", "valid boolean"),
    ],
)
def test_params_out_of_the_specs_bounds_cannot_be_built(field: str, value: Any, bound: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        SamplingParams(**{"max_tokens": 4, "n": 3 if field == "best_of" else 1, field: value})
    error = refused.value.errors()[0]
    assert error["loc"][0] == field and bound in error["msg"]


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (_request(max_tokens=0), "max_tokens 0 generates nothing: it is allowed only with prompt_logprobs"),
        (_request(min_tokens=5), "min_tokens (5) is more than max_tokens (4)"),
        (_request(prompt=None), "exactly one of prompt and messages"),
        (_request(messages=[{"role": "user", "content": "hi"}]), "exactly one of prompt and messages"),
        (_request(None, [{"role": "user", "content": "hi"}], "none"), "template 'none' applies to a prompt"),
    ],
)
def test_a_request_the_engine_cannot_run_fails_at_submit_naming_why(
    request_: GenerationRequest, named: str
) -> None:
    with pytest.raises(RequestError) as caught:
        validate_params(request_)
    assert caught.value.type is ErrorType.INVALID_REQUEST
    assert named in caught.value.message


def test_requests_in_bounds_pass() -> None:
    validate_params(_request())
    validate_params(_request(max_tokens=0, prompt_logprobs=1))  # scoring the prompt only
    validate_params(_request(temperature=2.0, top_p=1.0, n=2, best_of=4, logprobs=20, min_tokens=4,
                             logit_bias={0: -100.0, 1: 100.0}, repetition_penalty=2.0))  # fmt: skip
    validate_params(_request(None, [{"role": "user", "content": "hi"}], "chat"))


def test_logit_bias_must_name_tokens_of_the_vocabulary() -> None:
    check_vocabulary(SamplingParams(max_tokens=1, logit_bias={0: 1.0, 99: 1.0}), vocab=100)
    with pytest.raises(RequestError, match=r"logit_bias names token 100, outside .* \(0..99\)"):
        check_vocabulary(SamplingParams(max_tokens=1, logit_bias={100: 1.0}), vocab=100)

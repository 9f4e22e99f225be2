"""shared/jobspec.py: a job's fields declared once. The request models (POST /v1/jobs's JobCreate,
the OpenAI routes' requests) and the engine's SamplingParams take each field's bounds and default
from the spec, and the rules across fields are the spec's."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from api.openai.requests import ChatCompletionRequest, CompletionRequest
from shared.jobspec import CommonSampling, JobSpec, Sampling
from shared.schemas import JobCreate
from shared.structured import ANY_OBJECT
from workers.engine.types import SamplingParams

#: Where a request model's field differs from the spec's on purpose.
DIFFERS = {
    ("JobCreate", "max_tokens"): "null asks for the server's default",
    ("ChatCompletionRequest", "temperature"): "OpenAI's default is 1",
    ("CompletionRequest", "temperature"): "OpenAI's default is 1",
}


def _schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    properties: dict[str, Any] = model.model_json_schema(mode="validation")["properties"]
    return properties


@pytest.mark.parametrize(
    ("model", "fields"),
    [(JobCreate, Sampling.model_fields), (SamplingParams, Sampling.model_fields),
     (ChatCompletionRequest, CommonSampling.model_fields), (CompletionRequest, CommonSampling.model_fields)],
    ids=lambda value: getattr(value, "__name__", ""),
)  # fmt: skip
def test_each_field_has_the_specs_bounds_and_default_wherever_it_is_taken(
    model: type[pydantic.BaseModel], fields: dict[str, Any]
) -> None:
    spec, taken = _schema(Sampling), _schema(model)
    for name in fields:
        if (model.__name__, name) not in DIFFERS:
            assert taken[name] == spec[name], name


@pytest.mark.parametrize(
    ("fields", "max_tokens", "error"),
    [({}, 0, ("max_tokens", "allowed only with prompt_logprobs")), ({"prompt_logprobs": 0}, 0, None),
     ({"min_tokens": 5}, 4, ("min_tokens", "min_tokens (5) is more than max_tokens (4)")),
     ({"min_tokens": 4}, 4, None)],
)  # fmt: skip
def test_max_tokens_against_the_other_fields_is_one_rule(
    fields: dict[str, Any], max_tokens: int, error: tuple[str, str] | None
) -> None:
    """What the API asks of a request's resolved max_tokens (api/jobs/queue.py) and the engine of
    a request's (workers/engine/validation.py)."""
    found = Sampling(max_tokens=max_tokens, **fields).length_error(max_tokens)
    assert (found is None) == (error is None)
    if found is not None and error is not None:
        assert found[0] == error[0] and error[1] in found[1]


def test_best_of_must_cover_n_and_rows_count_the_larger() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"best_of \(2\) must be at least n \(3\)"):
        Sampling(max_tokens=1, n=3, best_of=2)
    assert Sampling(max_tokens=1, n=2, best_of=5).rows == 5 and Sampling(max_tokens=1, n=3).rows == 3


def test_a_stored_spec_ignores_fields_it_does_not_know_where_a_request_refuses_them() -> None:
    body = {"prompt": "hi", "max_tokens": 4, "from_a_newer_version": 1}
    assert JobSpec.model_validate(body).prompt == "hi"
    with pytest.raises(pydantic.ValidationError, match="from_a_newer_version"):
        JobCreate.model_validate(body)


def test_the_engine_enforces_the_schema_the_response_format_asks_for() -> None:
    def schema(response_format: dict[str, Any] | None) -> str | None:
        return SamplingParams.model_validate(
            JobSpec(prompt="hi", max_tokens=1, response_format=response_format), from_attributes=True
        ).json_schema

    assert schema(None) is None and schema({"type": "text"}) is None
    assert schema({"type": "json_object"}) == ANY_OBJECT
    asked = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    assert schema(asked) == '{"type": "integer"}'

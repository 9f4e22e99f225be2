"""shared/schemas.py: what POST /v1/jobs accepts. Each refused field is named in the error (its
`loc`), cross-field rules name both fields, unknown fields are refused, and a stored input from
before a field existed still reads."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from pydantic_core import ErrorDetails

from shared.jobspec import JobSpec
from shared.schemas import TERMINAL_STATUSES, JobCreate, JobStatus, Priority, WebhookEvent, error_body
from shared.structured import JSON_SCHEMA_MAX_BYTES, ResponseFormat


def _refused(body: dict[str, Any]) -> list[ErrorDetails]:
    with pytest.raises(pydantic.ValidationError) as caught:
        JobCreate.model_validate(body)
    return caught.value.errors()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 2.5), ("top_p", 0), ("max_tokens", -1), ("seed", -1), ("stop", ["a"] * 5),
        ("stop", [""]), ("presence_penalty", 3), ("repetition_penalty", 0), ("logit_bias", {"-1": 1}),
        ("logit_bias", {"5": 101}), ("logprobs", 21), ("n", 17), ("priority", "urgent"),
        ("webhook", "ftp://example.com/"), ("webhook_events_filter", []), ("metadata", {"": "x"}),
        ("template", "raw"), ("model", ""),
    ],
)  # fmt: skip
def test_each_bad_field_is_named(field: str, value: Any) -> None:
    errors = _refused({"prompt": "hi", field: value})
    assert errors and all(error["loc"][0] == field for error in errors), errors


def test_unknown_fields_are_refused() -> None:
    assert _refused({"prompt": "hi", "temprature": 0.5})[0]["loc"] == ("temprature",)


@pytest.mark.parametrize("body", [{}, {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}])
def test_exactly_one_of_prompt_or_messages(body: dict[str, Any]) -> None:
    assert "exactly one of `prompt` or `messages`" in _refused(body)[0]["msg"]


def test_cross_field_rules_name_both_values() -> None:
    assert "best_of (2) must be at least n (3)" in _refused({"prompt": "hi", "n": 3, "best_of": 2})[0]["msg"]
    messages = [{"role": "user", "content": "hi"}]
    assert (
        "`messages` always use the chat template"
        in _refused({"messages": messages, "template": "none"})[0]["msg"]
    )


def test_a_webhook_url_over_2048_characters_is_refused() -> None:
    error = _refused({"prompt": "hi", "webhook": "https://example.com/" + "a" * 2048})[0]
    assert error["loc"] == ("webhook",) and "2048" in error["msg"]


def test_response_format_needs_a_schema_exactly_when_json_schema() -> None:
    with pytest.raises(pydantic.ValidationError, match="exactly when type is 'json_schema'"):
        ResponseFormat.model_validate({"type": "json_schema"})
    # Parsing checks the shape and size only: whether a schema compiles is asked once the caller
    # is known (api/jobs/schema_compile.py, tests/api/jobs/test_schema_compile.py).
    unchecked = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/missing"}}}
    assert ResponseFormat.model_validate(unchecked).json_schema is not None
    huge = {"type": "object", "description": "x" * JSON_SCHEMA_MAX_BYTES}
    with pytest.raises(pydantic.ValidationError, match=f"over {JSON_SCHEMA_MAX_BYTES} bytes"):
        ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "x", "schema": huge}})
    accepted = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    )
    # "schema" on the wire, both ways.
    assert accepted.model_dump()["json_schema"]["schema"] == {"type": "object"}


def test_defaults_are_fresh_per_request() -> None:
    first, second = JobCreate(prompt="a"), JobCreate(prompt="b")
    first.webhook_events_filter.append(WebhookEvent.START)
    first.metadata["k"] = "v"
    assert second.webhook_events_filter == ["completed"] and second.metadata == {}
    assert first.stop == () and first.priority is Priority.INTERACTIVE


def test_an_input_stored_before_newer_fields_still_reads() -> None:
    old = {"prompt": "hi", "messages": None, "max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": None,
           "stop": [], "priority": "batch", "webhook": None, "webhook_events_filter": ["completed"],
           "cache": True, "allow_fallback": False}  # fmt: skip
    read = JobSpec.model_validate(old)
    assert (
        read.template == "chat" and read.n == 1 and read.repetition_penalty == 1.0 and read.logit_bias == {}
    )


def test_statuses_and_priorities() -> None:
    assert {s for s in JobStatus if s.is_terminal()} == TERMINAL_STATUSES
    assert not JobStatus.QUEUED.is_terminal() and not JobStatus.RUNNING.is_terminal()
    # Interactive jobs go to the list workers pop first.
    assert Priority.INTERACTIVE.broker_priority == 0 < Priority.BATCH.broker_priority == 9


def test_error_body_shape() -> None:
    assert error_body("not_found", "no such job", "job_id") == {
        "error": {"type": "not_found", "message": "no such job", "param": "job_id"}
    }

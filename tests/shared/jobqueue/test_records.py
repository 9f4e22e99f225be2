"""Job records as both tiers read them (shared/jobqueue/records.py): the codec of a record's input (the job's
spec, written by the API, read by the worker) and output, and the views the API returns."""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
import pytest

from shared.jobqueue.records import decode_input, encode_input, job_summary, public_job, succeeded_fields
from shared.jobspec import JobSpec
from shared.schemas import JobCreate, JobOutput, JobStatus

OUTPUT: JobOutput = {
    "text": "hi",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
}
RECORD = {
    "id": "j1", "owner": "key-a", "status": "succeeded", "model": "placeholder-echo",
    "input": '{"prompt":"hi"}', "output": orjson.dumps(OUTPUT).decode(), "metadata": '{"team":"a"}',
    "created_at": "1700000000.0", "started_at": "1700000000.25", "completed_at": "1700000001.0",
    "cached": "0", "preview": "hi",
}  # fmt: skip

SCHEMA = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True}}
#: Bodies whose specs must survive the record: every kind of field, set away from its default.
BODIES: list[dict[str, Any]] = [
    {"prompt": "hi"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]},
    {"prompt": "hi", "template": "none", "temperature": 1.5, "top_p": 0.5, "seed": 2**63 - 1},
    {"prompt": "hi", "stop": ["\n", "."], "presence_penalty": -2, "frequency_penalty": 2, "min_tokens": 3},
    {"prompt": "hi", "repetition_penalty": 0.5},
    {"prompt": "hi", "logit_bias": {"0": -100, "2147483647": 100}, "logprobs": 20, "prompt_logprobs": 0},
    {"prompt": "hi", "n": 3, "best_of": 5, "response_format": SCHEMA},
    {"prompt": "hi", "response_format": {"type": "json_object"}, "priority": "batch", "cache": False},
    {"prompt": "hi", "webhook": "https://example.com/hook", "webhook_events_filter": ["start", "output"]},
    {"prompt": "hi", "allow_fallback": True, "model": "other", "metadata": {"k": "v"}},
]  # fmt: skip


@pytest.mark.parametrize("body", BODIES)
def test_a_spec_reads_back_as_it_was_written(body: dict[str, Any]) -> None:
    spec = JobCreate.model_validate_json(orjson.dumps(body)).spec(max_tokens=16)
    stored = encode_input(spec)
    assert decode_input(stored) == spec
    assert encode_input(decode_input(stored)) == stored  # a record re-encodes to the same bytes
    assert set(orjson.loads(stored)) == set(JobSpec.model_fields)  # every field, defaults filled in


#: Inputs as earlier versions stored them (each lacks the fields added after it), with what they
#: read as: a job queued before an upgrade still runs after it.
OLD_INPUTS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (  # before templates, penalties, logit_bias, min_tokens, logprobs, response_format, n, best_of
        {"prompt": "hi", "messages": None, "max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": None,
         "stop": [], "priority": "batch", "webhook": None, "webhook_events_filter": ["completed"],
         "cache": True, "allow_fallback": False},
        {"template": "chat", "repetition_penalty": 1.0, "logit_bias": {}, "min_tokens": 0, "n": 1,
         "best_of": None, "logprobs": None, "json_schema": None, "priority": "batch"},
    ),
    (  # the last format before the spec: JobInput dumped to JSON (logit_bias keys are strings)
        {"prompt": "hi", "messages": None, "template": "none", "max_tokens": 5, "temperature": 0.7,
         "top_p": 0.9, "seed": 7, "stop": ["\n"], "presence_penalty": 0.5, "frequency_penalty": 0.25,
         "repetition_penalty": 1.1, "logit_bias": {"42": -100.0}, "min_tokens": 2, "logprobs": 3,
         "prompt_logprobs": None, "response_format": {"type": "json_object"}, "n": 2, "best_of": 3,
         "priority": "interactive", "webhook": "https://example.com/", "webhook_events_filter": ["start"],
         "cache": True, "allow_fallback": False},
        {"template": "none", "logit_bias": {42: -100.0}, "stop": ("\n",), "json_schema": '{"type": "object"}',
         "webhook_events_filter": ["start"], "n": 2, "best_of": 3},
    ),
    (  # written by a newer version, with a field this one does not know: ignored
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "future_field": 1},
        {"prompt": None, "max_tokens": 4, "temperature": 0.0},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("stored", "expected"), OLD_INPUTS)
def test_an_input_stored_by_an_earlier_version_reads_with_defaults(
    stored: dict[str, Any], expected: dict[str, Any]
) -> None:
    spec = decode_input(orjson.dumps(stored))
    assert {name: getattr(spec, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("stored", "field"),
    [({"prompt": "hi"}, "max_tokens"), ({"prompt": "hi", "max_tokens": 4, "top_p": 2}, "top_p"),
     ({"max_tokens": 4}, None)],
)  # fmt: skip
def test_an_input_that_is_no_spec_is_refused_naming_the_field(
    stored: dict[str, Any], field: str | None
) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        decode_input(orjson.dumps(stored))
    assert refused.value.errors()[0]["loc"] == ((field,) if field else ())


def test_a_success_writes_the_output_and_the_workers_metrics() -> None:
    fields = succeeded_fields(OUTPUT, inference_ms=12.34567, batch_size=4)
    assert fields["status"] == JobStatus.SUCCEEDED.value
    assert orjson.loads(fields["output"]) == OUTPUT  # absent optional parts stay absent, not null
    assert orjson.loads(fields["metrics"]) == {"inference_ms": 12.346, "batch_size": 4}
    job = public_job(RECORD | {k: v.decode() if isinstance(v, bytes) else v for k, v in fields.items()})
    assert job["output"] == OUTPUT and job["metrics"]["batch_size"] == 4


def test_a_job_view_carries_times_as_rfc3339_and_its_queue_time() -> None:
    job = public_job(RECORD)
    assert job["status"] is JobStatus.SUCCEEDED
    assert (job["created_at"], job["started_at"]) == ("2023-11-14T22:13:20.000Z", "2023-11-14T22:13:20.250Z")
    assert job["metrics"]["queue_ms"] == 250.0
    assert job["output"] == OUTPUT and job["metadata"] == {"team": "a"}
    assert job["urls"]["cancel"] == "/v1/jobs/j1/cancel"


def test_a_summary_has_the_preview_and_never_the_input_or_output() -> None:
    summary = job_summary(RECORD)
    assert summary["preview"] == "hi"
    assert "input" not in summary and "output" not in summary

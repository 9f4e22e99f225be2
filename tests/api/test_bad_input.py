"""Bad input gets a clear error (status, type, message naming the field) and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import assert_nothing_written

pytestmark = pytest.mark.anyio

CASES = [
    ({"prompt": "x", "colour": "blue"}, 422, "colour", "unknown field"),
    ({}, 422, "body", "exactly one of"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, 422, "body", "exactly one of"),
    ({"prompt": "x", "max_tokens": 0}, 422, "max_tokens", "allowed only with prompt_logprobs"),
    ({"prompt": "x", "max_tokens": -1}, 422, "max_tokens", "greater than or equal to 0"),
    ({"prompt": "x", "logprobs": 21}, 422, "logprobs", "less than or equal to 20"),
    ({"prompt": "x", "prompt_logprobs": -1}, 422, "prompt_logprobs", "greater than or equal to 0"),
    ({"prompt": "x", "n": 17}, 422, "n", "less than or equal to 16"),
    pytest.param(
        {
            "prompt": "x",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": {"type": "strin"}},
            },
        },
        422,
        "response_format",
        "the JSON schema cannot be enforced: Invalid type: strin",
        marks=pytest.mark.processes,  # the API compiles the schema in a child process
    ),
    (
        {"prompt": "x", "response_format": {"type": "json_schema"}},
        422,
        "response_format",
        "give `json_schema`",
    ),
    ({"prompt": "x", "response_format": {"type": "xml"}}, 422, "response_format.type", "'json_schema'"),
    ({"prompt": "x", "n": 3, "best_of": 2}, 422, "best_of", "best_of (2) must be at least n (3)"),
    ({"prompt": "x", "max_tokens": 5000}, 422, "max_tokens", "most allowed is 1024"),
    ({"prompt": "x", "temperature": 2.5}, 422, "temperature", "less than or equal to 2"),
    ({"prompt": "x", "top_p": 0}, 422, "top_p", "greater than 0"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 422, "stop", "at most 4"),
    ({"prompt": "x", "priority": "urgent"}, 422, "priority", "interactive"),
    ({"prompt": "x", "model": "gpt-9"}, 422, "model", "served models: placeholder-echo"),
    ({"prompt": "x", "webhook": "ftp://example.com/hook"}, 422, "webhook", "URL scheme"),
    ({"prompt": "x", "webhook_events_filter": ["finished"]}, 422, "webhook_events_filter.0", "start"),
    ({"prompt": "x", "metadata": {"k": 1}}, 422, "metadata.k", "string"),
    ({"prompt": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, 422, "metadata", "at most 16"),
    ({"messages": [{"role": "robot", "content": "y"}]}, 422, "messages.0.role", "system"),
    ({"prompt": ""}, 422, "prompt", "at least 1"),
    ({"prompt": "x", "template": "raw"}, 422, "template", "'chat' or 'none'"),
    ({"prompt": "x", "presence_penalty": 2.5}, 422, "presence_penalty", "less than or equal to 2"),
    ({"prompt": "x", "frequency_penalty": -3}, 422, "frequency_penalty", "greater than or equal to -2"),
    ({"prompt": "x", "repetition_penalty": 0}, 422, "repetition_penalty", "greater than 0"),
    ({"prompt": "x", "logit_bias": {"12": 101}}, 422, "logit_bias.12", "less than or equal to 100"),
    ({"prompt": "x", "logit_bias": {"cat": 1}}, 422, "logit_bias.cat.[key]", "valid integer"),
    ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 422, "min_tokens", "more than max_tokens (4)"),
    (
        {"messages": [{"role": "user", "content": "y"}], "template": "none"},
        422,
        "template",
        "applies to a `prompt`",
    ),
]


@pytest.mark.parametrize(("body", "status", "param", "phrase"), CASES)
async def test_schema_violations_name_the_field_and_create_nothing(
    api: httpx.AsyncClient,
    redis_client: redis.Redis,
    body: dict[str, Any],
    status: int,
    param: str,
    phrase: str,
) -> None:
    response = await api.post("/v1/jobs", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["param"] == param
    assert phrase in error["message"]
    assert_nothing_written(redis_client)


async def test_malformed_json_is_400(api: httpx.AsyncClient, redis_client: redis.Redis) -> None:
    response = await api.post(
        "/v1/jobs", content=b'{"prompt": "x"', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "malformed_request"
    assert_nothing_written(redis_client)


async def test_body_over_one_mib_is_413(api: httpx.AsyncClient, redis_client: redis.Redis) -> None:
    body = b'{"prompt": "' + b"a" * (1 << 20) + b'"}'
    response = await api.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit still holds while streaming
        for _ in range(20):
            yield b"a" * 65536

    streamed = await api.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert_nothing_written(redis_client)


NOT_JOB_IDS = [
    "6f1c0a2e-8b1d-4c3e-9f00-0123456789ab:stream",
    "not-a-job",
    "x" * 64,
    "6F1C0A2E-8B1D-4C3E-9F00-0123456789AB",
]


@pytest.mark.parametrize("job_id", NOT_JOB_IDS)
@pytest.mark.parametrize("suffix", ["", "/stream", "/webhooks", "?wait=1"])
async def test_anything_not_a_job_id_is_404_before_redis_is_asked(
    api: httpx.AsyncClient, redis_client: redis.Redis, job_id: str, suffix: str
) -> None:
    redis_client.config_resetstat()
    response = await api.get(f"/v1/jobs/{job_id}{suffix}")
    assert response.status_code == 404, response.text
    assert response.json()["error"] == {"type": "not_found", "message": f"no job {job_id!r}", "param": "id"}
    asked = redis_client.info("commandstats")
    assert not {"cmdstat_hgetall", "cmdstat_xrange", "cmdstat_lrange"} & set(asked), asked


async def test_cancel_of_a_non_id_is_404(api: httpx.AsyncClient, redis_client: redis.Redis) -> None:
    response = await api.post("/v1/jobs/..%2Fx/cancel")
    assert response.status_code == 404
    assert_nothing_written(redis_client)


@pytest.mark.parametrize("cursor", ["%C2%B3", "-1", "1.5", "12a", "1" * 21, ""])
async def test_a_cursor_this_api_never_returned_is_422(api: httpx.AsyncClient, cursor: str) -> None:
    response = await api.get(f"/v1/jobs?cursor={cursor}")
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "cursor"

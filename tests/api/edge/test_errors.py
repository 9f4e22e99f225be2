"""api/edge/errors.py: every genq error, Redis failure and framework refusal becomes one JSON
shape, `{"error": {"type", "message", "param"}}`, with the status and headers its type promises
(README's error table)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
import redis.exceptions
from fastapi import Response

from api.edge.errors import STATUS_OF, genq_error_response, internal_error_response, redis_error_response
from shared import errors

pytestmark = pytest.mark.anyio

#: (error, status, type, headers it must carry beyond the content type).
CASES: list[tuple[errors.GenqError, int, str, dict[str, str]]] = [
    (errors.MalformedRequest("m"), 400, "malformed_request", {}),
    (errors.Unauthorized("m"), 401, "unauthorized", {"www-authenticate": "Bearer"}),
    (errors.Forbidden("m", param="Host"), 403, "forbidden", {}),
    (errors.NotFound("m", param="id"), 404, "not_found", {}),
    (errors.Conflict("m", param="Idempotency-Key"), 409, "conflict", {}),
    (errors.PayloadTooLarge("m"), 413, "payload_too_large", {}),
    (errors.UnsupportedMediaType("m", param="Content-Type"), 415, "unsupported_media_type", {}),
    (errors.InvalidRequest("m", param="max_tokens"), 422, "invalid_request", {}),
    (
        errors.RateLimited("m", limit=4, remaining=0, reset_s=2.5, retry_after_s=0.2),
        429,
        "rate_limited",
        {
            "retry-after": "1",
            "x-ratelimit-limit": "4",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": "3",
        },
    ),
    (errors.QuotaExceeded("m", param="live_jobs"), 429, "quota_exceeded", {"retry-after": "5"}),
    (
        errors.ConcurrencyLimited("m", limit_name="streams", limit=2),
        429,
        "rate_limited",
        {"retry-after": "1", "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0"},
    ),
    (errors.Unavailable("m"), 503, "unavailable", {}),
    (errors.StorageRefused("m", retry_after_s=2.1), 503, "unavailable", {"retry-after": "3"}),
    (errors.Overloaded("m", retry_after_s=7), 503, "overloaded", {"retry-after": "7"}),
    (errors.GenqError("m"), 500, "internal_error", {}),
]


async def answer(response: Response) -> httpx.Response:
    """The response as a client receives it (sent through the ASGI interface)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=response), base_url="http://t") as client:
        return await client.get("/")


@pytest.mark.parametrize(
    ("error", "status", "type_", "headers"), CASES, ids=[type(c[0]).__name__ for c in CASES]
)
async def test_each_error_has_its_status_type_body_and_headers(
    error: errors.GenqError, status: int, type_: str, headers: dict[str, str]
) -> None:
    response = await answer(genq_error_response(error))
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": {"type": type_, "message": "m", "param": error.param}}
    assert {name: response.headers.get(name) for name in headers} == headers


def test_every_error_class_is_in_the_table_above() -> None:
    """A new error class of shared/errors.py without a status would answer 500; this test makes it
    choose one. (Classes other modules derive for their own handling, such as the OpenAI tier's
    JobNotCompleted in api/openai/responses.py, are theirs to test.)"""

    def subclasses(cls: type[errors.GenqError]) -> set[type[errors.GenqError]]:
        return {cls} | {c for sub in cls.__subclasses__() for c in subclasses(sub)}

    tested = {type(error) for error, *_ in CASES}
    declared = {cls for cls in subclasses(errors.GenqError) if cls.__module__ == errors.__name__}
    assert declared - tested == set()
    assert set(STATUS_OF) <= tested


@pytest.mark.parametrize(
    ("reply", "status", "type_"),
    [
        ("OOM command not allowed when used memory > 'maxmemory'.", 503, "unavailable"),
        ("READONLY You can't write against a read only replica.", 503, "unavailable"),
        ("MISCONF Redis is configured to save RDB snapshots, but it's unable to persist", 503, "unavailable"),
        ("ERR wrong number of arguments for 'hset' command", 500, "internal_error"),
    ],
)
async def test_a_redis_error_reply_is_a_refusal_or_an_internal_error(
    reply: str, status: int, type_: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="genq.api"):
        response = await answer(redis_error_response(redis.exceptions.ResponseError(reply)))
    assert response.status_code == status
    body: dict[str, Any] = response.json()
    assert body["error"]["type"] == type_
    assert "hset" not in body["error"]["message"]  # Redis's own text is logged, never sent
    if status == 503:
        assert "nothing was written" in body["error"]["message"] and int(response.headers["retry-after"]) >= 1


async def test_an_unexpected_exception_is_a_logged_json_500_that_leaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="genq.api"):
        response = await answer(internal_error_response(KeyError("secret-detail")))
    assert response.status_code == 500
    assert orjson.loads(response.content) == {
        "error": {
            "type": "internal_error",
            "message": "an internal error occurred; it was logged",
            "param": None,
        }
    }
    assert [r.message for r in caplog.records] == ["internal_error"] and caplog.records[0].exc_info


async def test_framework_refusals_take_the_same_shape(api: httpx.AsyncClient) -> None:
    missing = await api.get("/v1/no-such-route")
    assert missing.status_code == 404
    assert missing.json() == {"error": {"type": "not_found", "message": "Not Found", "param": None}}
    wrong = await api.delete("/healthz")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "method_not_allowed"
    assert wrong.headers["allow"] == "GET"

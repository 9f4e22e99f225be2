"""api/openai/errors.py: the errors genq answers, in OpenAI's shape and statuses, so the official
clients raise the error class a caller catches (BadRequestError for a 422, NotFoundError with
`model_not_found` for an unknown model, RateLimitError with its headers)."""

from __future__ import annotations

import httpx
import pytest
from fastapi import Response
from starlette.exceptions import HTTPException

from api.openai.errors import OpenAIErrors
from shared import errors

pytestmark = pytest.mark.anyio

#: (error, status, type, code, headers it must carry beyond the content type).
CASES: list[tuple[errors.GenqError, int, str, str, dict[str, str]]] = [
    (errors.MalformedRequest("m"), 400, "invalid_request_error", "malformed_request", {}),
    (errors.Unauthorized("m"), 401, "invalid_request_error", "invalid_api_key",
     {"www-authenticate": "Bearer"}),
    (errors.NotFound("m", param="file_id"), 404, "invalid_request_error", "not_found", {}),
    (errors.Conflict("m", param="file_id"), 409, "invalid_request_error", "conflict", {}),
    (errors.InvalidRequest("m", param="n"), 400, "invalid_request_error", "invalid_request", {}),
    (errors.InvalidRequest("m", param="model"), 404, "invalid_request_error", "model_not_found", {}),
    (errors.RateLimited("m", limit=4, remaining=0, reset_s=2.5, retry_after_s=0.2), 429,
     "rate_limit_error", "rate_limit_exceeded",
     {"retry-after": "1", "x-ratelimit-limit": "4", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "3"}),
    (errors.ConcurrencyLimited("m", limit_name="streams", limit=2), 429, "rate_limit_error",
     "rate_limit_exceeded", {"retry-after": "1"}),
    (errors.QuotaExceeded("m", param="file"), 429, "rate_limit_error", "quota_exceeded",
     {"retry-after": "5"}),
    (errors.Unavailable("m"), 503, "server_error", "unavailable", {}),
    (errors.StorageRefused("m", retry_after_s=2.1), 503, "server_error", "unavailable", {"retry-after": "3"}),
    (errors.Overloaded("m", retry_after_s=7), 503, "server_error", "overloaded", {"retry-after": "7"}),
    (errors.GenqError("m"), 500, "server_error", "internal_error", {}),
]  # fmt: skip


async def answer(response: Response) -> httpx.Response:
    """The response as a client receives it (sent through the ASGI interface)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=response), base_url="http://t") as client:
        return await client.get("/")


@pytest.mark.parametrize(("error", "status", "type_", "code", "headers"), CASES, ids=lambda v: repr(v)[:40])
async def test_each_error_has_openais_status_type_code_and_genqs_headers(
    error: errors.GenqError, status: int, type_: str, code: str, headers: dict[str, str]
) -> None:
    response = await answer(OpenAIErrors().genq(error))
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": {"message": "m", "type": type_, "param": error.param, "code": code}}
    assert {name: response.headers.get(name) for name in headers} == headers


async def test_a_framework_refusal_keeps_its_status_and_headers_but_a_422_is_400() -> None:
    unreadable = await answer(OpenAIErrors().http(HTTPException(400, "Missing boundary in multipart.")))
    assert unreadable.status_code == 400
    message = "Missing boundary in multipart."
    assert unreadable.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    unprocessable = await answer(OpenAIErrors().http(HTTPException(422, "x", headers={"X-Why": "y"})))
    assert (unprocessable.status_code, unprocessable.headers["x-why"]) == (400, "y")

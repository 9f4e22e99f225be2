"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, for the routes that
speak OpenAI's API (completions, models, files, batches): `OpenAIRoute`, a PipelineRoute whose
errors render this way. Which error a failure is stays api/edge/errors.py's; here only how it
reads: OpenAI's type and code for the status, 422 answered as 400 (as OpenAI does), an unknown
model as 404 `model_not_found`, and a per-key quota (stored file bytes, active batches, live jobs)
as a 429 whose code says quota (`quota_exceeded`), so a client can tell a bound it must free room
under from a rate limit it need only wait out (`rate_limit_exceeded`).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.edge.errors import ErrorRenderer, headers_of, status_of
from api.edge.pipeline import PipelineRoute
from api.edge.responses import json_response
from shared.errors import GenqError, QuotaExceeded

_TYPE_OF_STATUS = {401: "invalid_request_error", 429: "rate_limit_error"}
_CODE_OF_STATUS = {401: "invalid_api_key", 429: "rate_limit_exceeded"}


def openai_error(
    status: int, message: str, param: str | None, code: str | None, headers: dict[str, str] | None = None
) -> Response:
    kind = _TYPE_OF_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json_response(body, status, headers)


#: A list index in genq's field path ("messages.0.content").
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def _openai_field(message: str, param: str | None) -> tuple[str, str | None]:
    """The message and param with genq's field path in OpenAI's style ("messages.0.content" ->
    "messages[0].content"), where the message starts with it too."""
    if param is None:
        return message, None
    field = _INDEX.sub(r"[\1]", param)
    if message.startswith(param + ":"):
        message = field + message[len(param) :]
    return message, field


class OpenAIErrors(ErrorRenderer):
    """The errors genq answers, in OpenAI's shape and statuses (same headers: Retry-After,
    rate-limit state, WWW-Authenticate)."""

    def genq(self, exc: GenqError) -> Response:
        status, param = status_of(exc), exc.param
        code = exc.type if isinstance(exc, QuotaExceeded) else _CODE_OF_STATUS.get(status, exc.type)
        if status == 422 and param == "model":
            status, code = 404, "model_not_found"
        message, param = _openai_field(exc.message, param)
        return openai_error(400 if status == 422 else status, message, param, code, headers_of(exc))

    def http(self, exc: StarletteHTTPException) -> Response:
        status = 400 if exc.status_code == 422 else exc.status_code
        return openai_error(status, str(exc.detail), None, None, dict(exc.headers or {}))


class OpenAIRoute(PipelineRoute):
    """A PipelineRoute whose errors leave in OpenAI's shape."""

    renderer = OpenAIErrors()


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


#: The error answers an OpenAI route documents (its `responses=`).
OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIErrorBody} for code in (400, 401, 404, 429, 500, 503)
}

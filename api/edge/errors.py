"""The one place genq errors become HTTP responses: `{"error": {"type", "message", "param"}}`."""

from __future__ import annotations

import logging

import redis.exceptions
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.edge.responses import json_response
from shared import errors, metrics
from shared.logging import fields
from shared.schemas import error_body

log = logging.getLogger("genq.api")

HTTP_ERROR_TYPES = {400: "malformed_request", 404: "not_found", 405: "method_not_allowed"}

STATUS_OF: dict[type[errors.GenqError], int] = {
    errors.MalformedRequest: 400,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.InvalidRequest: 422,
    errors.RateLimited: 429,
    errors.QuotaExceeded: 429,
    errors.ConcurrencyLimited: 429,
    errors.Unavailable: 503,
    errors.Overloaded: 503,
}


def _status(exc: errors.GenqError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 500


def genq_error_response(exc: errors.GenqError) -> Response:
    headers = exc.headers | ({"WWW-Authenticate": "Bearer"} if isinstance(exc, errors.Unauthorized) else {})
    return json_response(error_body(exc.type, exc.message, exc.param), _status(exc), headers)


def redis_down_response(exc: Exception) -> Response:
    log.warning("redis_unavailable", extra=fields(error=type(exc).__name__))
    return genq_error_response(errors.Unavailable("the job store (Redis) is unreachable; retry shortly"))


def redis_error_response(exc: redis.exceptions.ResponseError) -> Response:
    """A Redis error reply: a refused write (full, read-only, cannot persist) is 503 with
    Retry-After; anything else is a bug, answered as a JSON 500 and logged."""
    refusal = errors.storage_refusal(exc)
    if refusal is None:
        return internal_error_response(exc)
    metrics.STORAGE_REFUSED.labels("api").inc()
    log.warning("store_write_refused", extra=fields(error=refusal.message))
    return genq_error_response(refusal)


def internal_error_response(exc: BaseException) -> Response:
    log.error("internal_error", exc_info=exc, extra=fields(error=type(exc).__name__))
    return genq_error_response(errors.GenqError("an internal error occurred; it was logged"))


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


def validation_error_response(exc: RequestValidationError) -> Response:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return genq_error_response(errors.MalformedRequest("the body is not valid JSON"))
    field = _field_path(tuple(first.get("loc", ())))
    message = f"{field}: {first.get('msg', 'invalid value')}"
    if first.get("type") == "extra_forbidden":
        message = f"{field}: unknown field"
    return genq_error_response(errors.InvalidRequest(message, param=field))


def install_error_handlers(app: FastAPI) -> None:
    async def on_genq_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GenqError)
        return genq_error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return validation_error_response(exc)

    async def on_redis_down(_: Request, exc: Exception) -> Response:
        return redis_down_response(exc)

    async def on_http_error(_: Request, exc: Exception) -> Response:
        # Starlette's own refusals (unknown route, wrong method, unreadable body) in our shape.
        assert isinstance(exc, StarletteHTTPException)
        type_ = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
        return json_response(error_body(type_, str(exc.detail)), exc.status_code, exc.headers)

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(errors.GenqError, on_genq_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)

    async def on_redis_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, redis.exceptions.ResponseError)
        return redis_error_response(exc)

    async def on_anything_else(_: Request, exc: Exception) -> Response:
        return internal_error_response(exc)

    app.add_exception_handler(redis.exceptions.ConnectionError, on_redis_down)
    app.add_exception_handler(redis.exceptions.TimeoutError, on_redis_down)
    app.add_exception_handler(redis.exceptions.ResponseError, on_redis_error)
    app.add_exception_handler(Exception, on_anything_else)

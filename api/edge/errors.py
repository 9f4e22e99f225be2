"""The one place errors become HTTP responses: which genq error an exception is answered as
(`error_of`), and genq's shape for it, `{"error": {"type", "message", "param"}}`. A route class
that answers in another shape (OpenAI's: api/openai/errors.py) brings its own ErrorRenderer for
the same errors."""

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


def status_of(exc: errors.GenqError) -> int:
    """The HTTP status of a genq error (its nearest class in STATUS_OF; 500 if none)."""
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 500


def headers_of(exc: errors.GenqError) -> dict[str, str]:
    """The headers an answer to `exc` carries, whatever its body's shape."""
    return exc.headers | ({"WWW-Authenticate": "Bearer"} if isinstance(exc, errors.Unauthorized) else {})


def genq_error_response(exc: errors.GenqError) -> Response:
    return json_response(error_body(exc.type, exc.message, exc.param), status_of(exc), headers_of(exc))


def http_error_response(exc: StarletteHTTPException) -> Response:
    """Starlette's own refusals (unknown route, wrong method, unreadable body) in genq's shape."""
    type_ = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
    return json_response(error_body(type_, str(exc.detail)), exc.status_code, exc.headers)


class ErrorRenderer:
    """How a route's errors read on the wire: genq's shape. A route class with another shape
    (api/openai/errors.py) subclasses it; which errors map to what stays error_of's alone."""

    def genq(self, exc: errors.GenqError) -> Response:
        return genq_error_response(exc)

    def http(self, exc: StarletteHTTPException) -> Response:
        return http_error_response(exc)


GENQ_ERRORS = ErrorRenderer()


def error_of(exc: Exception) -> errors.GenqError | None:
    """The genq error an exception is answered as (logged where it needs a look), or None for
    one that is a bug (the app's last handler answers it: internal_error_response, a 500)."""
    match exc:
        case errors.GenqError():
            return exc
        case RequestValidationError():
            return validation_error(exc)
        case redis.exceptions.ConnectionError() | redis.exceptions.TimeoutError():
            return redis_down(exc)
        case redis.exceptions.ResponseError():
            return redis_refusal(exc)
    return None


def redis_down(exc: Exception) -> errors.Unavailable:
    log.warning("redis_unavailable", extra=fields(error=type(exc).__name__))
    return errors.Unavailable("the job store (Redis) is unreachable; retry shortly")


def redis_refusal(exc: redis.exceptions.ResponseError) -> errors.GenqError:
    """A Redis error reply: a refused write (full, read-only, cannot persist) is 503 with
    Retry-After; anything else is a bug, answered as a 500 and logged."""
    refusal = errors.storage_refusal(exc)
    if refusal is None:
        return internal_error(exc)
    metrics.STORAGE_REFUSED.labels("api").inc()
    log.warning("store_write_refused", extra=fields(error=refusal.message))
    return refusal


def internal_error(exc: BaseException) -> errors.GenqError:
    log.error("internal_error", exc_info=exc, extra=fields(error=type(exc).__name__))
    return errors.GenqError("an internal error occurred; it was logged")


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


def validation_error(exc: RequestValidationError) -> errors.GenqError:
    """FastAPI's refusal of a request's parameters: malformed JSON (400), or the first field
    that does not validate, named (422)."""
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return errors.MalformedRequest("the body is not valid JSON")
    field = _field_path(tuple(first.get("loc", ())))
    message = f"{field}: {first.get('msg', 'invalid value')}"
    if first.get("type") == "extra_forbidden":
        message = f"{field}: unknown field"
    return errors.InvalidRequest(message, param=field)


def redis_down_response(exc: Exception) -> Response:
    return genq_error_response(redis_down(exc))


def redis_error_response(exc: redis.exceptions.ResponseError) -> Response:
    return genq_error_response(redis_refusal(exc))


def internal_error_response(exc: BaseException) -> Response:
    return genq_error_response(internal_error(exc))


def validation_error_response(exc: RequestValidationError) -> Response:
    return genq_error_response(validation_error(exc))


def install_error_handlers(app: FastAPI) -> None:
    """genq's shape for the errors no PipelineRoute answered (serve() answers its routes' own):
    an unknown path or method, and the routes that take no caller (/metrics' token, the probes)."""

    async def on_genq_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GenqError)
        return genq_error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return validation_error_response(exc)

    async def on_redis_down(_: Request, exc: Exception) -> Response:
        return redis_down_response(exc)

    async def on_http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return http_error_response(exc)

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

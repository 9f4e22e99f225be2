"""genq's one error hierarchy. Each error carries the `type` a client branches on; the API maps
them to HTTP statuses in exactly one place (api/errors.py)."""

from __future__ import annotations


class GenqError(Exception):
    type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(GenqError):
    type = "invalid_request"


class MalformedRequest(GenqError):
    type = "malformed_request"


class PayloadTooLarge(GenqError):
    type = "payload_too_large"


class Unauthorized(GenqError):
    type = "unauthorized"


class NotFound(GenqError):
    type = "not_found"


class Conflict(GenqError):
    type = "conflict"


class Unavailable(GenqError):
    """A dependency (Redis) is unreachable; the request changed nothing."""

    type = "unavailable"

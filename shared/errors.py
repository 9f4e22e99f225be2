"""genq's one error hierarchy. Each error carries the `type` a client branches on; the API maps
them to HTTP statuses in exactly one place (api/edge/errors.py)."""

from __future__ import annotations

import math


class GenqError(Exception):
    type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers the answer must carry (Retry-After, rate-limit state)."""
        return {}


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


class Forbidden(GenqError):
    type = "forbidden"


class UnsupportedMediaType(GenqError):
    type = "unsupported_media_type"


class Conflict(GenqError):
    type = "conflict"


class Unavailable(GenqError):
    """A dependency (Redis) is unreachable; the request changed nothing."""

    type = "unavailable"


class StorageRefused(Unavailable):
    """The job store refused a write (out of memory, a read-only replica after a failover, a failed
    snapshot): nothing was written; reads still work."""

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class QuotaExceeded(GenqError):
    """The API key holds as many live jobs, or stored bytes, as its bound allows; `param` names
    the bound. Other keys are not affected."""

    type = "quota_exceeded"

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


_FULL = "the job store is full (Redis maxmemory)"
_READ_ONLY = "the job store is read-only (a replica, or a failover in progress)"
#: What Redis says when it refuses a write while up (redis-py drops the error code of the
#: classes it knows, so their messages are matched too; a script's error embeds them).
WRITE_REFUSALS = {
    "OOM command not allowed": _FULL,
    "command not allowed when used memory": _FULL,
    "READONLY": _READ_ONLY,
    "You can't write against a read only replica": _READ_ONLY,
    "MISCONF": "the job store cannot persist (Redis snapshot failing)",
}


def storage_refusal(error: Exception) -> StorageRefused | None:
    """The StorageRefused a Redis error reply means, or None when it means something else."""
    text = str(error)
    for marker, meaning in WRITE_REFUSALS.items():
        if marker in text:
            return StorageRefused(f"{meaning}; nothing was written, retry shortly")
    return None


class RateLimited(GenqError):
    type = "rate_limited"

    def __init__(
        self,
        message: str,
        *,
        limit: int,
        remaining: int,
        reset_s: float,
        retry_after_s: float,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.limit_headers = rate_limit_headers(limit, remaining, reset_s)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return self.limit_headers | {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class ConcurrencyLimited(GenqError):
    """The caller holds as many requests of one kind (streams, long-polls) as its limit allows;
    `param` names the limit. Only this caller is refused: nobody else's requests share the slots."""

    type = "rate_limited"

    def __init__(self, message: str, *, limit_name: str, limit: int) -> None:
        super().__init__(message, param=limit_name)
        self.limit = limit

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1", "X-RateLimit-Limit": str(self.limit), "X-RateLimit-Remaining": "0"}


class Overloaded(GenqError):
    """Admission control shed the request: the queue is full."""

    type = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


def rate_limit_headers(limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    return {
        "X-RateLimit-Limit": str(limit),
        "X-RateLimit-Remaining": str(max(0, remaining)),
        "X-RateLimit-Reset": str(max(0, math.ceil(reset_s))),
    }

"""HTTP metrics (ASGI middleware labelled by route template, never the raw path), request ids,
and the headers that api/edge/pipeline.py's serve() left in `request.state.response_headers`
(rate-limit state). The /metrics endpoint that exposes them is api/routes/ops.py's."""

from __future__ import annotations

import os
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.metrics import HTTP_DURATION, HTTP_REQUESTS, REQUESTS_INFLIGHT


class HttpMetrics:
    """Counts and times every request, and adds its request id and the headers left for it. It
    sits outside the hot path (api/app.py), so both ways of serving are observed alike."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        request_id = request_id_of(_header(scope, b"x-request-id"))

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                extra = scope.get("state", {}).get("response_headers", {})
                own = list(message.get("headers", []))
                message["headers"] = [*own, *extra_headers(request_id, extra, {name for name, _ in own})]
            await send(message)

        started = time.perf_counter()
        REQUESTS_INFLIGHT.inc()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            REQUESTS_INFLIGHT.dec()
            route = scope.get("route")
            observe(getattr(route, "path", None) or "unmatched", scope["method"], status, started)


def observe(template: str, method: str, status: int, started: float) -> None:
    """Count one answered request under its route template (never the raw path)."""
    key = (template, method, status)
    children = _children.get(key)
    if children is None:  # labels() takes a lock and validates: once per combination, not per request
        children = _children[key] = (
            HTTP_REQUESTS.labels(template, method, str(status)),
            HTTP_DURATION.labels(template),
        )
    requests, duration = children
    requests.inc()
    duration.observe(time.perf_counter() - started)


_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def request_id_of(sent: bytes | None) -> str:
    """The client's X-Request-ID when it is a sensible length, else a new one."""
    if sent is not None and 0 < len(sent) <= 128:
        return sent.decode("latin-1")
    return os.urandom(16).hex()


def extra_headers(
    request_id: str, more: dict[str, str], present: frozenset[bytes] | set[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """What every response carries besides its own headers: its request id, and the headers that
    serve() left for it (rate-limit state) unless the response set them itself (`present`, lower
    case): a 429 from a concurrency limit describes the limit that refused it, not the caller's
    read bucket, and a header must not carry both."""
    added = ((name.lower().encode(), value.encode()) for name, value in more.items())
    return [(b"x-request-id", request_id.encode("latin-1")), *(h for h in added if h[0] not in present)]


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None

"""HTTP metrics (ASGI middleware labelled by route template, never the raw path), request ids,
headers that api/edge/pipeline.py's serve() left in `request.state.response_headers` (rate-limit
state), and the /metrics endpoint (multiprocess-aware)."""

from __future__ import annotations

import hmac
import os
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.jobs.queue_stats import QueueStatsReader
from shared.config import Settings
from shared.errors import Unauthorized
from shared.metrics import (
    HTTP_DURATION,
    HTTP_REQUESTS,
    REQUESTS_INFLIGHT,
    BatchStatsCollector,
    QueueStatsCollector,
)

router = APIRouter(tags=["ops"])


class HttpMetrics:
    """Counts and times every request, and adds its request id and the headers left for it. The
    app (api/app.py) wraps both the hot path and FastAPI in it, so both are observed alike."""

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


def _require_metrics_token(settings: Settings, authorization: str | None) -> None:
    if settings.metrics_token is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    expected = settings.metrics_token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise Unauthorized("/metrics needs `Authorization: Bearer <GENQ_METRICS_TOKEN>`")


def _registry() -> CollectorRegistry:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus exposition: this process's (or all API processes') instruments plus the queue
    statistics and Redis's memory, read from Redis at most once a second. With GENQ_METRICS_TOKEN,
    only for a request that sends it as a Bearer token."""
    _require_metrics_token(request.app.state.settings, request.headers.get("authorization"))
    reader: QueueStatsReader = request.app.state.queue_stats
    registry = CollectorRegistry()
    registry.register(QueueStatsCollector(await reader.read()))
    registry.register(BatchStatsCollector(await request.app.state.batches.store.snapshot()))
    body = generate_latest(_registry()) + generate_latest(registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

"""HTTP metrics (ASGI middleware labelled by route template, never the raw path), request ids,
headers that dependencies left in `request.state.response_headers` (rate-limit state), and the
/metrics endpoint (multiprocess-aware)."""

from __future__ import annotations

import os
import time
import uuid

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.queue_stats import QueueStatsReader
from shared.metrics import HTTP_DURATION, HTTP_REQUESTS, REQUESTS_INFLIGHT, QueueStatsCollector

router = APIRouter(tags=["ops"])


class HttpMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        request_id = _request_id(scope)

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                extra = scope.get("state", {}).get("response_headers", {})
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                    *((name.lower().encode(), value.encode()) for name, value in extra.items()),
                ]
            await send(message)

        started = time.perf_counter()
        REQUESTS_INFLIGHT.inc()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            REQUESTS_INFLIGHT.dec()
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            HTTP_REQUESTS.labels(template, scope["method"], str(status)).inc()
            HTTP_DURATION.labels(template).observe(time.perf_counter() - started)


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and 0 < len(value) <= 128:
            return bytes(value).decode("latin-1")
    return uuid.uuid4().hex


def _registry() -> CollectorRegistry:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus exposition: this process's (or all API processes') instruments plus the queue
    statistics, read from Redis at most once a second."""
    reader: QueueStatsReader = request.app.state.queue_stats
    stats, unacked = await reader.read()
    registry = CollectorRegistry()
    registry.register(QueueStatsCollector(stats, unacked))
    body = generate_latest(_registry()) + generate_latest(registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

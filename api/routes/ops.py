"""What operators call: the liveness and readiness probes, and /metrics (Prometheus)."""

from __future__ import annotations

import hmac
import os

import redis.exceptions
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from pydantic import BaseModel

from api.edge.responses import json_response
from api.jobs.fleet import live_workers
from api.jobs.queue_stats import QueueStatsReader
from api.routes.deps import RedisDep, SettingsDep
from shared.config import Settings
from shared.errors import Unauthorized
from shared.metrics import BatchStatsCollector, QueueStatsCollector

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> Response:
    """The process is alive."""
    return json_response({"status": "ok"})


class Readiness(BaseModel):
    status: str
    workers: int | None = None
    reason: str | None = None


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(client: RedisDep, settings: SettingsDep) -> Response:
    """Redis is reachable and at least one worker is consuming; 503 says which is not."""
    try:
        await client.ping()
        workers = await live_workers(client, settings.heartbeat_ttl_s)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        # What failed, never the client's error text (it names hosts, ports, sometimes credentials).
        return json_response({"status": "unavailable", "reason": "Redis unreachable"}, 503)
    if workers == 0:
        reason = f"no worker has sent a heartbeat in the last {settings.heartbeat_ttl_s:g} s"
        return json_response({"status": "unavailable", "reason": reason}, 503)
    return json_response({"status": "ready", "workers": workers})


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

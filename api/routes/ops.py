"""Liveness and readiness probes."""

from __future__ import annotations

import redis.exceptions
from fastapi import APIRouter, Response
from pydantic import BaseModel

from api.edge.deps import RedisDep, SettingsDep
from api.edge.responses import json_response
from api.jobs.fleet import live_workers

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

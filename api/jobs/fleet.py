"""The worker fleet as the API reads it from the workers' heartbeats (workers/jobs.py writes them):
how many model workers are live (/readyz) and how many job slots they offer (the batch feeder's
capacity)."""

from __future__ import annotations

import time
from typing import cast

import redis.asyncio as aioredis

from shared import keys


async def live_workers(client: aioredis.Redis, heartbeat_ttl_s: float) -> int:
    """How many model workers sent a heartbeat within heartbeat_ttl_s."""
    return int(await client.zcount(keys.WORKERS, time.time() - heartbeat_ttl_s, "+inf"))


async def fleet_slots(client: aioredis.Redis, heartbeat_ttl_s: float, unknown: int) -> int:
    """Job slots of the model workers that sent a heartbeat within heartbeat_ttl_s; a live worker
    that published none (an older version) counts as `unknown` slots."""
    live = cast(list[str], await client.zrangebyscore(keys.WORKERS, time.time() - heartbeat_ttl_s, "+inf"))
    if not live:
        return 0
    slots = await client.hmget(keys.WORKER_SLOTS, live)
    return sum(int(s) if s is not None else unknown for s in slots)

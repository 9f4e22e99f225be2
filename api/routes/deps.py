"""FastAPI dependencies as Annotated aliases: what a route may ask for besides its caller (a
route asks for that as a CallerDep: api/edge/pipeline.py).

All are `async def`: FastAPI runs a plain `def` dependency in a worker thread, and that thread hop
costs more than the dependency's work."""

from __future__ import annotations

from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Request

from api.jobs.queue import JobQueue
from api.jobs.schema_compile import SchemaChecker
from shared.config import Settings


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_queue(request: Request) -> JobQueue:
    queue: JobQueue = request.app.state.queue
    return queue


async def get_schema_checker(request: Request) -> SchemaChecker:
    checker: SchemaChecker = request.app.state.schema_checker
    return checker


async def get_redis(request: Request) -> aioredis.Redis:
    client: aioredis.Redis = request.app.state.redis
    return client


SettingsDep = Annotated[Settings, Depends(get_settings)]
QueueDep = Annotated[JobQueue, Depends(get_queue)]
RedisDep = Annotated[aioredis.Redis, Depends(get_redis)]
SchemaCheckerDep = Annotated[SchemaChecker, Depends(get_schema_checker)]

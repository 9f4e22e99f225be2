"""api/routes/deps.py: the dependencies hand a route the running app's own services, and are all
`async def` (FastAPI runs a plain `def` dependency on a worker thread: a hop per request on the
hot paths)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import pytest
from fastapi import FastAPI, Request

from api.routes import deps

pytestmark = pytest.mark.anyio

DEPENDENCIES = [(deps.get_settings, "settings"), (deps.get_queue, "queue"), (deps.get_redis, "redis")]


@pytest.mark.parametrize(("dependency", "state"), DEPENDENCIES, ids=[name for _, name in DEPENDENCIES])
async def test_each_dependency_is_the_apps_own_service_without_a_thread_hop(
    app: FastAPI, dependency: Callable[[Request], Awaitable[object]], state: str
) -> None:
    assert inspect.iscoroutinefunction(dependency)
    request = Request({"type": "http", "app": app, "headers": []})
    assert await dependency(request) is getattr(app.state, state)

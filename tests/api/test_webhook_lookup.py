"""A webhook whose host resolves through a name server that never answers holds nothing but a
thread of the webhook lookup pool: the submit ends with 422 naming the time bound, a second one
finds the pool full and is refused at once (503), and another tenant's submit is answered
meanwhile. The name server is a real UDP server on loopback (tests/name_server.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
import redis

from shared.config import Settings
from tests.conftest import api_client
from tests.name_server import BlackHoledNameServer

pytestmark = pytest.mark.anyio

BAD, GOOD = {"Authorization": "Bearer bad"}, {"Authorization": "Bearer good"}


@pytest.fixture
def name_server() -> Iterator[BlackHoledNameServer]:
    server = BlackHoledNameServer()
    yield server
    server.close()


async def test_other_tenants_submit_while_webhook_lookups_hang(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    name_server: BlackHoledNameServer,
) -> None:
    settings = make_settings(
        api_keys=["bad", "good"], webhook_resolve_threads=1, webhook_resolve_queue=0,
        webhook_resolve_timeout_s=1.0,
    )  # fmt: skip
    settings.webhook_policy.resolver.lookup = name_server.lookup
    hooked = {"prompt": "x", "webhook": "http://hook.example:8080/done"}
    async with api_client(settings) as api:
        waiting = asyncio.create_task(api.post("/v1/jobs", json=hooked, headers=BAD))
        await asyncio.to_thread(name_server.wait_for_queries, 1)
        # The pool's one thread is held by the black hole: another webhook is refused at once ...
        refused = await api.post("/v1/jobs", json=hooked, headers=BAD)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "overloaded"
        # ... and a submit without one is answered while the lookup hangs (nothing answered it).
        assert (await api.post("/v1/jobs", json={"prompt": "y"}, headers=GOOD)).status_code == 202
        assert len(name_server.askers) == 1
        timed_out = await waiting
        assert timed_out.status_code == 422, timed_out.text
        error = timed_out.json()["error"]
        assert error["param"] == "webhook" and "could not be resolved within 1 s" in error["message"]

"""Webhook hosts resolve at submit on a pool of their own, within a time bound: against a name
server that never answers (a real UDP server on loopback that reads queries and sends nothing),
a lookup ends with a 422 naming the bound, a full pool refuses at once (503), and meanwhile the
event loop's default pool (where Redis connections resolve) goes on. tests/api/test_webhook_lookup.py
has the same over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from shared.errors import InvalidRequest, Overloaded
from shared.ssrf import HostResolver
from tests.name_server import BlackHoledNameServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def name_server() -> Iterator[BlackHoledNameServer]:
    server = BlackHoledNameServer()
    yield server
    server.close()


async def test_a_black_holed_name_ends_in_time_and_a_full_pool_refuses_at_once(
    name_server: BlackHoledNameServer,
) -> None:
    resolver = HostResolver(threads=2, queue=1, timeout_s=0.3, lookup=name_server.lookup)
    hanging = [asyncio.create_task(resolver.addresses(f"h{i}.example", 443)) for i in range(3)]
    await asyncio.to_thread(name_server.wait_for_queries, 2)  # both threads are blocked on it
    with pytest.raises(Overloaded, match="webhook host lookups are pending"):
        await resolver.addresses("h3.example", 443)
    # The loop's default pool is untouched: what Redis's connection set-up runs there still runs.
    assert await asyncio.get_running_loop().run_in_executor(None, sum, [1, 2]) == 3
    for task in hanging:
        with pytest.raises(InvalidRequest, match=r"could not be resolved within 0\.3 s") as refused:
            await task
        assert refused.value.param == "webhook"
    # The queued lookup left the queue when it timed out; the two blocked threads still count.
    assert len(name_server.askers) == 2 and resolver.pending() == 2

"""api/edge/concurrency.py: per key, at most GENQ_MAX_STREAMS_PER_KEY open streams and
GENQ_MAX_LONG_POLLS_PER_KEY waiting requests; the one past the limit gets 429 naming the limit,
nobody else is refused, and a slot given back can be taken again. The counter directly, then
through the app over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis

from api.edge.concurrency import ConcurrencyLimits
from shared.config import Settings
from shared.errors import ConcurrencyLimited
from tests.api.live_server import live_client
from tests.conftest import api_client

pytestmark = pytest.mark.anyio


def test_the_slot_past_the_limit_is_refused_and_a_freed_one_is_reusable(
    make_settings: Callable[..., Settings],
) -> None:
    limits = ConcurrencyLimits(make_settings(max_streams_per_key=2, max_long_polls_per_key=1))
    held = [limits.acquire("alice", "streams"), limits.acquire("alice", "streams")]
    with pytest.raises(ConcurrencyLimited) as refused:
        limits.acquire("alice", "streams")
    assert refused.value.type == "rate_limited" and refused.value.param == "streams"
    assert "GENQ_MAX_STREAMS_PER_KEY" in refused.value.message and refused.value.limit == 2
    limits.acquire("bob", "streams")  # another key's slots are its own
    limits.acquire("alice", "long_polls")  # and so are another kind's
    held[0].release()
    held[0].release()  # a second release gives nothing back twice
    limits.acquire("alice", "streams")
    with pytest.raises(ConcurrencyLimited):
        limits.acquire("alice", "streams")
    with limits.acquire("bob", "long_polls"):
        pass  # the context manager gives its slot back
    limits.acquire("bob", "long_polls")


def test_a_keys_override_replaces_the_default(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_long_polls_per_key=1, rate_limit_overrides={"key-big": {"long_polls": "3"}})
    limits = ConcurrencyLimits(settings)
    assert [limits.limit("key-big", "long_polls"), limits.limit("key-small", "long_polls")] == [3, 1]
    for _ in range(3):
        limits.acquire("key-big", "long_polls")
    with pytest.raises(ConcurrencyLimited) as refused:
        limits.acquire("key-big", "long_polls")
    assert refused.value.limit == 3 and refused.value.param == "long_polls"


async def test_the_second_stream_of_a_key_is_a_429_until_the_first_closes(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key", "bob-key"], max_streams_per_key=1)
    async with live_client(settings, "alice-key") as alice, live_client(settings, "bob-key") as bob:
        mine = (await alice.post("/v1/jobs", json={"prompt": "nobody runs this"})).json()["id"]
        theirs = (await bob.post("/v1/jobs", json={"prompt": "nor this"})).json()["id"]
        async with alice.stream("GET", f"/v1/jobs/{mine}/stream") as first:
            assert first.status_code == 200
            second = await alice.get(f"/v1/jobs/{mine}/stream")
            assert second.status_code == 429
            assert second.json()["error"]["type"] == "rate_limited"
            assert second.json()["error"]["param"] == "streams"
            assert second.headers["retry-after"] == "1"
            # The headers describe the limit that refused it, once: not also the read bucket's
            # (api/edge/observability.py adds the bucket's only where a response set none).
            assert second.headers.get_list("x-ratelimit-limit") == ["1"]
            assert second.headers.get_list("x-ratelimit-remaining") == ["0"]
            async with bob.stream("GET", f"/v1/jobs/{theirs}/stream") as others:
                assert others.status_code == 200
        for _ in range(50):  # the server sees the first stream's client leave, then frees its slot
            async with alice.stream("GET", f"/v1/jobs/{mine}/stream") as again:
                if again.status_code == 200:
                    break
            await asyncio.sleep(0.05)
        assert again.status_code == 200


async def test_a_key_past_its_long_polls_is_refused_while_another_key_waits_on(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key", "bob-key"], max_long_polls_per_key=1)
    async with api_client(settings) as api:
        alice, bob = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
        job = (await api.post("/v1/jobs", json={"prompt": "queued"}, headers=alice)).json()["id"]
        waiting = asyncio.create_task(api.get(f"/v1/jobs/{job}", params={"wait": 1}, headers=alice))
        await asyncio.sleep(0.2)
        refused = await api.get(f"/v1/jobs/{job}", params={"wait": 1}, headers=alice)
        assert refused.status_code == 429 and refused.json()["error"]["param"] == "long_polls"
        refused_submit = await api.post(
            "/v1/jobs", json={"prompt": "x"}, headers=alice | {"Prefer": "wait=1"}
        )
        assert refused_submit.status_code == 429
        other = (await api.post("/v1/jobs", json={"prompt": "b"}, headers=bob)).json()["id"]
        assert (await api.get(f"/v1/jobs/{other}", params={"wait": 0.2}, headers=bob)).status_code == 200
        assert (await waiting).status_code == 200
        assert (await api.get(f"/v1/jobs/{job}", params={"wait": 0.2}, headers=alice)).status_code == 200

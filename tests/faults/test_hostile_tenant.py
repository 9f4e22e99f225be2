"""Key A misbehaves, key B must not notice: two API keys against a real `genq api` process and a
real worker. A tries every route on B's jobs (404 each, nothing changed), holds streams and
long-polls past its limits (429 for A only; B's latency and /readyz unchanged; the API's Redis
connections do not grow with A's streams), and lists big jobs (API memory stays bounded).

Per-key webhook secrets: tests/workers/webhooks/test_tasks.py; every SSRF class, at submit and at
delivery: tests/shared/test_ssrf.py. `python -m bench.tenants` measures the same at 10,000 streams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
import redis

from bench.common import process_tree, rss_mb
from bench.tenants import IDLE_MODEL, b_latency, open_stream, owner_of
from shared.config import Settings
from tests.conftest import ApiProcess, WorkerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

KEY_A, KEY_B = "hostile-a", "victim-b"
#: More than the API's Redis pool (512 connections): one pooled connection per stream would
#: exhaust it, and every request of every key would get 503.
A_STREAMS = 600
A_LONG_POLLS = 40
#: What listing 100 jobs of ~1 MiB each may add to the API's RSS (reading whole records took
#: hundreds of MB: 200 records a round, 20 rounds).
LIST_RSS_BOUND_MB = 40


@pytest.fixture
def tenants(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    overrides = {owner_of(KEY_A): {"streams": str(A_STREAMS), "long_polls": str(A_LONG_POLLS)}}
    return make_settings(
        api_keys=[KEY_A, KEY_B],
        models=[IDLE_MODEL],  # A's jobs go there: no worker serves it, so they never end
        rate_limit_overrides=overrides,
        placeholder_step_s=0,
        max_wait_s=120,
    )


@asynccontextmanager
async def as_key(api: ApiProcess, key: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=A_LONG_POLLS + 20)
    async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=60, limits=limits) as client:
        yield client


async def test_a_key_reaches_none_of_another_keys_jobs(
    tenants: Settings, start_api: Callable[[Settings], ApiProcess], redis_client: redis.Redis
) -> None:
    api = start_api(tenants)
    async with as_key(api, KEY_A) as a, as_key(api, KEY_B) as b:
        job = (await b.post("/v1/jobs", json={"prompt": "b's", "model": IDLE_MODEL, "webhook": None})).json()
        before = redis_client.hgetall(f"genq:job:{job['id']}")
        attempts = [
            a.get(f"/v1/jobs/{job['id']}"),
            a.get(f"/v1/jobs/{job['id']}", params={"wait": 1}),
            a.post(f"/v1/jobs/{job['id']}/cancel"),
            a.get(f"/v1/jobs/{job['id']}/stream"),
            a.get(f"/v1/jobs/{job['id']}/webhooks"),
        ]
        for response in [await attempt for attempt in attempts]:
            assert response.status_code == 404, (response.request.url, response.text)
            assert response.json()["error"]["type"] == "not_found"
        assert (await a.get("/v1/jobs")).json()["data"] == []
        assert redis_client.hgetall(f"genq:job:{job['id']}") == before  # A's cancel changed nothing
        assert (await b.get(f"/v1/jobs/{job['id']}")).json()["status"] == "queued"


async def test_streams_and_long_polls_past_a_keys_limit_cost_only_that_key(
    tenants: Settings,
    start_api: Callable[[Settings], ApiProcess],
    worker: WorkerProcess,
    redis_client: redis.Redis,
) -> None:
    api = start_api(tenants)
    port = int(api.url.rsplit(":", 1)[1])
    async with as_key(api, KEY_A) as a, as_key(api, KEY_B) as b:
        held_job = (await a.post("/v1/jobs", json={"prompt": "a", "model": IDLE_MODEL})).json()["id"]
        await b_latency(b, 20, 2)  # warm-up
        quiet = await b_latency(b, 150, 5)
        clients_quiet = int(redis_client.info("clients")["connected_clients"])

        held = [await open_stream(port, held_job, KEY_A) for _ in range(A_STREAMS)]
        # Held for 15 s: long enough to measure, short enough to let the API stop after the test
        # (a long-poll holds its slot until it answers, even for a client that went away).
        polls = [
            asyncio.create_task(a.get(f"/v1/jobs/{held_job}", params={"wait": 15}))
            for _ in range(A_LONG_POLLS)
        ]
        await asyncio.sleep(1.0)
        stream = await a.get(f"/v1/jobs/{held_job}/stream")
        poll = await a.get(f"/v1/jobs/{held_job}", params={"wait": 1})
        submit_and_wait = await a.post("/v1/jobs", json={"prompt": "x"}, headers={"Prefer": "wait=5"})
        for refused, limit in ((stream, "streams"), (poll, "long_polls"), (submit_and_wait, "long_polls")):
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["type"] == "rate_limited"
            assert refused.json()["error"]["param"] == limit
        assert len((await a.get("/v1/jobs")).json()["data"]) == 1  # the refused `Prefer: wait` made no job

        busy = await b_latency(b, 150, 5)
        # The streams share one reader: Redis sees a handful more clients, not one per stream.
        assert int(redis_client.info("clients")["connected_clients"]) < clients_quiet + 10
        assert busy["readyz"] == 200
        assert busy["get_p99_ms"] < max(3 * quiet["get_p99_ms"], 50), (quiet, busy)
        assert busy["finish_p99_ms"] < max(3 * quiet["finish_p99_ms"], 500), (quiet, busy)

        for _, writer in held:
            writer.close()
        await asyncio.sleep(1.0)  # the API notices the closed connections and gives the slots back
        reopened = await open_stream(port, held_job, KEY_A)
        reopened[1].close()
        assert {poll.status_code for poll in await asyncio.gather(*polls)} == {200}
        assert (await a.get(f"/v1/jobs/{held_job}", params={"wait": 0.1})).status_code == 200  # slots back


async def test_listing_big_jobs_keeps_the_api_memory_bounded(
    tenants: Settings, start_api: Callable[[Settings], ApiProcess]
) -> None:
    api = start_api(tenants)
    big = [{"role": "user", "content": "y" * 120_000} for _ in range(8)]  # ~0.96 MB of input
    async with as_key(api, KEY_A) as a:
        for _ in range(100):
            submitted = await a.post("/v1/jobs", json={"messages": big, "model": IDLE_MODEL})
            assert submitted.status_code == 202, submitted.text
        pids = process_tree(api.process.pid)
        before = rss_mb(pids)
        for _ in range(10):
            page = await a.get("/v1/jobs", params={"limit": 100})
            assert page.status_code == 200
            assert len(page.content) <= tenants.list_max_bytes + 200
        grown = rss_mb(pids) - before
    assert grown < LIST_RSS_BOUND_MB, f"listing grew the API by {grown:.1f} MiB"
    print(json.dumps({"list_rss_growth_mb": round(grown, 1)}))

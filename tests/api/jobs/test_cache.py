"""The response cache and single-flight coalescing, end to end: the real app, the suite's Redis,
real worker processes running the placeholder model (deterministic, so a cached answer is checkable).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import REGISTRY

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = pytest.mark.anyio

GREEDY = {"prompt": "the quick brown fox", "max_tokens": 6}
ECHO = "the quick brown fox the quick"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    return make_settings(rate_limit_submit="", rate_limit_read="")


async def _done(api: httpx.AsyncClient, job_id: str, timeout_s: float = 30) -> dict[str, Any]:
    job: dict[str, Any] = (await api.get(f"/v1/jobs/{job_id}", params={"wait": timeout_s})).json()
    return job


async def _wait_status(api: httpx.AsyncClient, job_id: str, status: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while (await api.get(f"/v1/jobs/{job_id}")).json()["status"] != status:
        assert time.monotonic() < deadline, f"job {job_id} never became {status}"
        await asyncio.sleep(0.02)


async def _generated(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """Submit, expect a miss, and wait for the generation to end."""
    response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return await _done(api, response.json()["id"])


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _generations(redis_client: redis.Redis) -> int:
    """Jobs a worker claimed (each claim is one generation)."""
    records = [redis_client.hgetall(k) for k in redis_client.scan_iter("genq:job:*", _type="hash")]
    return sum(int(r.get("attempts", 0)) for r in records if "id" in r)


async def test_a_repeat_is_answered_at_once_from_the_cache(
    api: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    first = await _generated(api, GREEDY)
    assert first["status"] == "succeeded" and first["output"]["text"] == ECHO and not first["cached"]
    hits_before = _metric("genq_cache_hits_total", level="l2")

    response = await api.post("/v1/jobs", json=GREEDY)  # level 2 (the worker wrote it)
    assert response.status_code == 200
    hit = response.json()
    assert hit["id"] != first["id"] and hit["status"] == "succeeded" and hit["cached"] is True
    assert hit["output"] == first["output"] and hit["model_label"] == first["model_label"]
    assert hit["metrics"]["inference_ms"] == 0
    assert hit["started_at"] and hit["completed_at"]
    assert (await api.get(hit["urls"]["get"])).json() == hit
    assert _metric("genq_cache_hits_total", level="l2") == hits_before + 1

    l1_before = _metric("genq_cache_hits_total", level="l1")
    again = await api.post("/v1/jobs", json={**GREEDY, "temperature": 0, "top_p": 1.0, "stop": []})
    assert again.status_code == 200 and again.json()["output"] == first["output"]
    assert _metric("genq_cache_hits_total", level="l1") == l1_before + 1
    assert _metric("genq_cache_l1_entries") >= 1 and _metric("genq_cache_l1_bytes") > 0


async def test_another_replica_hits_level_two_and_fills_its_level_one(
    api: httpx.AsyncClient, settings: Settings, worker: WorkerProcess
) -> None:
    await _generated(api, GREEDY)
    async with api_client(settings) as replica:
        l2_before = _metric("genq_cache_hits_total", level="l2")
        assert (await replica.post("/v1/jobs", json=GREEDY)).json()["cached"] is True
        assert _metric("genq_cache_hits_total", level="l2") == l2_before + 1
        l1_before = _metric("genq_cache_hits_total", level="l1")
        assert (await replica.post("/v1/jobs", json=GREEDY)).json()["cached"] is True
        assert _metric("genq_cache_hits_total", level="l1") == l1_before + 1


@pytest.mark.parametrize(
    ("body", "cacheable"),
    [
        ({"temperature": 0.7}, False),
        ({"temperature": 0.7, "seed": 7}, True),
        ({"cache": False}, False),
    ],
)
async def test_only_deterministic_requests_opted_in_are_cached(
    api: httpx.AsyncClient,
    worker: WorkerProcess,
    redis_client: redis.Redis,
    body: dict[str, Any],
    cacheable: bool,
) -> None:
    request = {**GREEDY, **body}
    await _generated(api, request)
    assert bool(list(redis_client.scan_iter("genq:cache:*"))) is cacheable
    second = await api.post("/v1/jobs", json=request)
    assert (second.status_code == 200) is cacheable
    assert second.json()["cached"] is cacheable


async def test_cache_false_does_not_read_an_existing_entry(
    api: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    await _generated(api, GREEDY)
    response = await api.post("/v1/jobs", json={**GREEDY, "cache": False})
    assert response.status_code == 202 and response.json()["cached"] is False


async def test_entries_expire(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(cache_ttl_s=1, cache_l1_ttl_s=0.5, rate_limit_submit="")
    start_worker(settings)
    async with api_client(settings) as api:
        await _generated(api, GREEDY)
        assert (await api.post("/v1/jobs", json=GREEDY)).json()["cached"] is True
        await asyncio.sleep(1.3)
        assert not list(redis_client.scan_iter("genq:cache:*"))
        assert (await api.post("/v1/jobs", json=GREEDY)).status_code == 202


async def test_a_new_model_revision_does_not_see_old_entries(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, worker: WorkerProcess
) -> None:
    settings = make_settings(cache_fingerprint_refresh_s=0.2, rate_limit_submit="")
    async with api_client(settings) as api:
        await _generated(api, GREEDY)
        assert (await api.post("/v1/jobs", json=GREEDY)).json()["cached"] is True
        redis_client.hset(keys.MODELS, "placeholder-echo", "a-new-revision")
        await asyncio.sleep(0.3)
        assert (await api.post("/v1/jobs", json=GREEDY)).status_code == 202


async def test_no_fingerprint_published_means_no_caching(
    api: httpx.AsyncClient, redis_client: redis.Redis
) -> None:
    misses = _metric("genq_cache_misses_total")
    for _ in range(2):
        assert (await api.post("/v1/jobs", json=GREEDY)).status_code == 202
    assert _metric("genq_cache_misses_total") == misses + 2
    assert not list(redis_client.scan_iter("genq:inflight:*"))  # not cacheable: no coalescing either


async def test_a_hit_sends_its_webhooks(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(webhook_allow_private=True, rate_limit_submit="")
    start_worker(settings)
    async with api_client(settings) as api:
        await _generated(api, GREEDY)
        redis_client.delete(keys.WEBHOOK_QUEUE)
        body = {
            **GREEDY,
            "webhook": "http://127.0.0.1:9000/hook",
            "webhook_events_filter": ["start", "completed"],
        }
        hit = (await api.post("/v1/jobs", json=body)).json()
        assert hit["cached"] is True
    messages = redis_client.lrange(keys.WEBHOOK_QUEUE, 0, -1)
    # Workers BRPOP: the right end goes first, so `start` must be the rightmost.
    assert [_webhook_event(m) for m in reversed(messages)] == [[hit["id"], "start"], [hit["id"], "completed"]]


def _webhook_event(message: str | bytes) -> Any:
    import base64
    import json

    return json.loads(base64.b64decode(json.loads(message)["body"]))[0]


# --- coalescing -------------------------------------------------------------------------------------


@pytest.fixture
def slow_settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    return make_settings(placeholder_step_s=0.05, rate_limit_submit="", rate_limit_read="")


@pytest.fixture
async def slow_api(slow_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(slow_settings) as client:
        yield client


async def test_fifty_identical_concurrent_submissions_cause_one_generation(
    slow_api: httpx.AsyncClient,
    slow_settings: Settings,
    start_worker: Callable[..., WorkerProcess],
    redis_client: redis.Redis,
) -> None:
    start_worker(slow_settings)
    coalesced = _metric("genq_cache_coalesced_total")
    responses = await asyncio.gather(*(slow_api.post("/v1/jobs", json=GREEDY) for _ in range(50)))
    assert {r.status_code for r in responses} == {202}
    ids = [r.json()["id"] for r in responses]
    assert len(set(ids)) == 50
    jobs = await asyncio.gather(*(_done(slow_api, job_id) for job_id in ids))
    assert {job["status"] for job in jobs} == {"succeeded"}
    assert {job["output"]["text"] for job in jobs} == {ECHO}
    assert _generations(redis_client) == 1
    assert _metric("genq_cache_coalesced_total") == coalesced + 49
    assert sum(not job["cached"] for job in jobs) == 1  # the leader; followers had no generation
    assert not list(redis_client.scan_iter("genq:inflight:*"))
    assert not list(redis_client.scan_iter("genq:job:*:followers"))


async def test_followers_fail_with_the_leaders_error(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    # A run longer than the job timeout fails with `timeout` while running.
    settings = make_settings(placeholder_step_s=0.2, job_timeout_s=1.0, rate_limit_submit="")
    start_worker(settings)
    body = {"prompt": "slow words", "max_tokens": 50}
    async with api_client(settings) as api:
        ids = [(await api.post("/v1/jobs", json=body)).json()["id"] for _ in range(5)]
        jobs = [await _done(api, job_id) for job_id in ids]
    assert {job["status"] for job in jobs} == {"failed"}
    assert len({str(job["error"]) for job in jobs}) == 1 and jobs[0]["error"]["type"] == "timeout"
    assert _generations(redis_client) == 1
    assert not list(redis_client.scan_iter("genq:cache:*"))  # failures are never cached


async def test_canceling_the_leader_promotes_a_follower(
    slow_api: httpx.AsyncClient,
    slow_settings: Settings,
    start_worker: Callable[..., WorkerProcess],
    redis_client: redis.Redis,
) -> None:
    start_worker(slow_settings)
    body = {"prompt": "one two three four", "max_tokens": 20}
    leader = (await slow_api.post("/v1/jobs", json=body)).json()["id"]
    await _wait_status(slow_api, leader, "running")
    followers = [(await slow_api.post("/v1/jobs", json=body)).json()["id"] for _ in range(3)]
    canceled = (await slow_api.post(f"/v1/jobs/{leader}/cancel")).json()
    assert canceled["status"] == "canceled"
    jobs = [await _done(slow_api, job_id) for job_id in followers]
    assert {job["status"] for job in jobs} == {"succeeded"}
    assert len({job["output"]["text"] for job in jobs}) == 1
    # The leader's run and the promoted follower's: the other two followed the new leader.
    assert _generations(redis_client) == 2
    assert sum(not job["cached"] for job in jobs) == 1
    assert (await slow_api.post("/v1/jobs", json=body)).json()["cached"] is True


async def test_a_canceled_follower_does_not_cancel_the_leader(
    slow_api: httpx.AsyncClient, slow_settings: Settings, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(slow_settings)
    body = {"prompt": "alpha beta", "max_tokens": 10}
    leader = (await slow_api.post("/v1/jobs", json=body)).json()["id"]
    follower = (await slow_api.post("/v1/jobs", json=body)).json()["id"]
    assert (await slow_api.post(f"/v1/jobs/{follower}/cancel")).json()["status"] == "canceled"
    assert (await _done(slow_api, leader))["status"] == "succeeded"
    assert (await slow_api.get(f"/v1/jobs/{follower}")).json()["status"] == "canceled"


# --- a dedicated cache Redis ----------------------------------------------------------------------


@pytest.fixture
def cache_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "cache-redis", appendonly=False)
    server.start()
    yield server
    server.stop()


async def test_a_dedicated_cache_redis_going_down_leaves_level_one_and_fails_nothing(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    cache_server: EmbeddedRedis,
) -> None:
    settings = make_settings(cache_redis_url=cache_server.url, rate_limit_submit="")
    start_worker(settings)
    async with api_client(settings) as api:
        await _generated(api, GREEDY)
        assert not list(redis_client.scan_iter("genq:cache:*"))  # it went to the dedicated server
        assert (await api.post("/v1/jobs", json=GREEDY)).json()["cached"] is True  # level 2, fills level 1
        cache_server.stop()
        started = time.monotonic()
        assert (await api.post("/v1/jobs", json=GREEDY)).json()["cached"] is True  # level 1
        other = await _generated(api, {"prompt": "something else", "max_tokens": 3})
        assert other["status"] == "succeeded"
        assert time.monotonic() - started < 10


@pytest.mark.parametrize("shared", [False, True])
async def test_with_keys_each_key_has_its_own_cache_unless_shared(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    shared: bool,
) -> None:
    settings = make_settings(api_keys=["key-a", "key-b"], cache_shared_across_keys=shared)
    start_worker(settings)
    async with api_client(settings, "key-a") as alice, api_client(settings, "key-b") as bob:
        first = await _generated(alice, GREEDY)
        assert (await alice.post("/v1/jobs", json=GREEDY)).json()["cached"] is True
        other = await bob.post("/v1/jobs", json=GREEDY)
        # Per key: B's identical request is a miss, so `cached` tells B nothing about A.
        assert other.json()["cached"] is shared
        assert (await _done(bob, other.json()["id"]))["output"] == first["output"]
        if not shared:
            assert (await bob.post("/v1/jobs", json=GREEDY)).json()["cached"] is True  # B's own entry

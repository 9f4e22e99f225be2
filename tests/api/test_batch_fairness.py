"""Fair sharing between batches and with interactive jobs: the feeder's weighted round-robin
split of free capacity and its capacity rule (pure functions, table-driven), the fleet's slots
as workers publish them (a real Redis), and through real processes two keys' batches, and an
interactive job that starts at once beside a batch that would otherwise fill every slot."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aioredis

from api.batches.feeder import batch_capacity, fair_shares
from shared import keys
from shared.config import Settings
from shared.store import WorkerJobs, fleet_slots
from tests.api.live_server import live_server
from tests.api.routes.test_batches import chat_line, completed, metric, start_batch
from tests.api.routes.test_openai import client_for
from tests.conftest import TEST_MODEL, WorkerProcess


@pytest.mark.parametrize(
    ("demands", "free", "start", "expected"),
    [
        # One key alone takes what it wants, up to what is free.
        ({"a": {"a1": 64}}, 10, 0, {"a1": 10}),
        # Two keys split evenly, whatever one of them asks for.
        ({"a": {"a1": 64}, "b": {"b1": 64}}, 10, 0, {"a1": 5, "b1": 5}),
        # A key with two batches gets the same share as a key with one; its batches split it.
        ({"a": {"a1": 64, "a2": 64}, "b": {"b1": 64}}, 8, 0, {"a1": 2, "a2": 2, "b1": 4}),
        # What a key cannot use goes to the others.
        ({"a": {"a1": 64}, "b": {"b1": 1}}, 10, 0, {"a1": 9, "b1": 1}),
        # An odd slot goes to the key the rotation starts at, so it alternates period by period.
        ({"a": {"a1": 64}, "b": {"b1": 64}}, 1, 0, {"a1": 1}),
        ({"a": {"a1": 64}, "b": {"b1": 64}}, 1, 1, {"b1": 1}),
        # Nothing free, nothing wanted.
        ({"a": {"a1": 64}}, 0, 0, {}),
        ({"a": {"a1": 0}}, 5, 0, {}),
        ({}, 5, 0, {}),
    ],
)
def test_fair_shares(
    demands: dict[str, dict[str, int]], free: int, start: int, expected: dict[str, int]
) -> None:
    assert fair_shares(demands, free, start) == expected


@pytest.mark.parametrize(
    ("demands", "free", "weights", "expected"),
    [
        # A key of weight 3 gets three lines for each one of a key of weight 1.
        ({"a": {"a1": 64}, "b": {"b1": 64}}, 8, {"a": 3}, {"a1": 6, "b1": 2}),
        # Its batches split its share round-robin.
        ({"a": {"a1": 64, "a2": 64}, "b": {"b1": 64}}, 9, {"a": 2}, {"a1": 3, "a2": 3, "b1": 3}),
        # A weight does not let a key take more than it wants: the rest goes to the others.
        ({"a": {"a1": 2}, "b": {"b1": 64}}, 8, {"a": 5}, {"a1": 2, "b1": 6}),
        # Weights of keys with no active batch change nothing.
        ({"a": {"a1": 64}, "b": {"b1": 64}}, 4, {"c": 9}, {"a1": 2, "b1": 2}),
    ],
)
def test_fair_shares_by_weight(
    demands: dict[str, dict[str, int]], free: int, weights: dict[str, int], expected: dict[str, int]
) -> None:
    assert fair_shares(demands, free, 0, weights) == expected


@pytest.mark.parametrize(
    ("slots", "reserve", "max_inflight", "expected"),
    [
        (16, 0.25, 256, 12),  # a quarter of one default worker's 16 slots kept for interactive jobs
        (32, 0.25, 256, 24),  # two workers
        (16, 0.0, 256, 16),  # no reserve: batches may fill every slot
        (16, 0.25, 8, 8),  # GENQ_BATCH_MAX_INFLIGHT still bounds it
        (1, 0.25, 256, 1),  # a one-slot fleet still makes progress on batches
        (0, 0.25, 256, 0),  # no live worker: nothing fed to wait in the queue
    ],
)
def test_batch_capacity(slots: int, reserve: float, max_inflight: int, expected: int) -> None:
    assert batch_capacity(slots, reserve, max_inflight) == expected


@pytest.mark.anyio
async def test_fleet_slots_count_live_workers_only(settings: Settings, redis_client: redis.Redis) -> None:
    jobs = WorkerJobs(redis_client, lease_s=30, max_attempts=3, job_timeout_s=60)
    jobs.heartbeat("w1", slots=16)
    jobs.heartbeat("w2", slots=4)
    jobs.heartbeat("hooks", keys.WEBHOOK_WORKERS)  # a webhook-only worker runs no jobs
    redis_client.zadd(keys.WORKERS, {"old-version": time.time()})  # published no slots
    redis_client.zadd(keys.WORKERS, {"gone": time.time() - 3600})  # its heartbeat lapsed
    redis_client.hset(keys.WORKER_SLOTS, "gone", 64)
    client = aioredis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    try:
        assert await fleet_slots(client, heartbeat_ttl_s=30, unknown=8) == 16 + 4 + 8
        jobs.leave("w1")
        assert redis_client.hget(keys.WORKER_SLOTS, "w1") is None
        assert await fleet_slots(client, heartbeat_ttl_s=30, unknown=8) == 4 + 8
        redis_client.delete(keys.WORKERS)
        assert await fleet_slots(client, heartbeat_ttl_s=30, unknown=8) == 0
    finally:
        await client.aclose()


def test_a_small_batch_of_another_key_is_not_starved(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Alice's 60 lines hold all the capacity when Bob's 4 arrive; Bob's still finish long before
    Alice's (each key gets half of what frees up)."""
    settings = make_settings(
        api_keys=["alice-key", "bob-key"], placeholder_step_s=0.02, batch_window=4, batch_max_inflight=4
    )
    start_worker(settings)
    with live_server(settings) as url:
        alice, bob = client_for(url, "alice-key"), client_for(url, "bob-key")
        lines = [chat_line(f"r{i}", f"x {i}", max_tokens=20, temperature=0) for i in range(60)]
        big = start_batch(alice, b"".join(lines))
        while alice.batches.retrieve(big.id).status != "in_progress":
            time.sleep(0.05)
        small = start_batch(bob, b"".join(lines[:4]))
        deadline = time.monotonic() + 60
        while (done := bob.batches.retrieve(small.id)).status != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        behind = alice.batches.retrieve(big.id)
        assert behind.status == "in_progress", behind
        assert behind.request_counts is not None and done.request_counts is not None  # optional in the SDK
        assert behind.request_counts.completed < 40, behind.request_counts
        assert done.request_counts.completed == 4


def test_an_interactive_job_starts_at_once_beside_a_batch(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed store: no worker or batch of an earlier test counts
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A worker with 4 slots and a batch that wants 8 lines at once: the batch gets 3 (a quarter
    kept back), so an interactive job submitted mid-batch starts at once and ends while the first
    lines (ten seconds each) are still running. With no reserve it would wait for one of them."""
    settings = make_settings(placeholder_step_s=0.05, worker_concurrency=4, batch_window=8)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        lines = [chat_line(f"r{i}", f"x {i}", max_tokens=200, temperature=0) for i in range(8)]
        batch = start_batch(client, b"".join(lines))
        deadline = time.monotonic() + 30
        while metric(url, "genq_batch_lines_inflight") < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        answer = client.completions.create(model=TEST_MODEL, prompt="now", max_tokens=2, temperature=0)
        assert answer.choices[0].text
        assert completed(client, batch.id) == 0
        assert max(metric(url, "genq_batch_lines_inflight") for _ in range(5)) <= 3

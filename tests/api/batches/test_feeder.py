"""api/batches/feeder.py: the feeder shares capacity fairly between batches and keeps some for
interactive jobs, through real processes: two keys' batches, and an interactive job that starts at
once beside a batch that would otherwise fill every slot. The sharing arithmetic itself is tested
table-driven in tests/api/batches/test_capacity.py, the fleet's slots as workers publish them in
tests/api/jobs/test_fleet.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.routes.test_batches import chat_line, completed, metric, start_batch
from tests.api.routes.test_openai import client_for
from tests.conftest import TEST_MODEL, WorkerProcess


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

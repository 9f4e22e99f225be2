"""api/batches/feeder.py: the feeder shares capacity fairly between batches and keeps some for
interactive jobs, through real processes: two keys' batches, and an interactive job that starts at
once beside a batch that would otherwise fill every slot. The sharing arithmetic itself is tested
table-driven in tests/api/batches/test_capacity.py, the fleet's slots as workers publish them in
tests/api/jobs/test_fleet.py."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

import redis

from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.routes.test_batches import chat_line, completed, metric, start_batch, wait_for
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
        wait_for_inflight(url, 3)
        answer = client.completions.create(model=TEST_MODEL, prompt="now", max_tokens=2, temperature=0)
        assert answer.choices[0].text
        assert completed(client, batch.id) == 0
        assert max(metric(url, "genq_batch_lines_inflight") for _ in range(5)) <= 3


def test_the_reserve_holds_against_lines_of_several_samples(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed store: no worker or batch of an earlier test counts
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The same worker of 4 slots, a batch whose lines ask for n=2: each line runs two sequences,
    so the batch's 3 rows hold one line at a time (three, as lines were counted, would take six
    slots of four), and an interactive job still starts at once."""
    settings = make_settings(placeholder_step_s=0.05, worker_concurrency=4, batch_window=8)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        lines = [chat_line(f"r{i}", f"x {i}", max_tokens=200, temperature=1, n=2) for i in range(8)]
        batch = start_batch(client, b"".join(lines))
        wait_for_inflight(url, 1)
        answer = client.completions.create(model=TEST_MODEL, prompt="now", max_tokens=2, temperature=0)
        assert answer.choices[0].text
        assert completed(client, batch.id) == 0
        assert max(metric(url, "genq_batch_lines_inflight") for _ in range(5)) == 1


def test_a_batch_whose_files_storage_lost_fails_and_the_others_go_on(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Mid-batch, the input file's content and the batch's own result parts go from the file
    storage (deleted, or storage lost). The feeder cannot read them again in any period: that batch
    ends failed, saying so in OpenAI's batch errors, and a batch created after it (stepped after it
    in each period) completes."""
    settings = make_settings(
        api_keys=["alice-key", "bob-key"], placeholder_step_s=0.05, batch_window=1, batch_max_inflight=4
    )
    storage = settings.data_dir / "files"
    start_worker(settings)
    with live_server(settings) as url:
        alice, bob = client_for(url, "alice-key"), client_for(url, "bob-key")
        lines = [chat_line("a0", "x", max_tokens=1), chat_line("a1", "y", max_tokens=40, temperature=0),
                 chat_line("a2", "z", max_tokens=1)]  # fmt: skip
        broken = start_batch(alice, b"".join(lines))
        deadline = time.monotonic() + 30
        while completed(alice, broken.id) < 1:  # a0's result is in a committed part; a1 runs
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (storage / broken.input_file_id).unlink()
        shutil.rmtree(storage / broken.id)
        healthy = start_batch(bob, b"".join(chat_line(f"b{i}", "hi", max_tokens=1) for i in range(3)))
        failed = wait_for(alice, broken.id, {"failed", "completed", "cancelled", "expired"})
        assert failed.status == "failed", failed
        assert failed.errors is not None and failed.errors.data is not None
        (error,) = failed.errors.data
        assert error.code == "file_not_found" and error.message is not None
        assert broken.input_file_id in error.message and "removed from storage" in error.message
        done = wait_for(bob, healthy.id, {"failed", "completed", "cancelled", "expired"})
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 3


def wait_for_inflight(url: str, lines: int) -> None:
    """Until the feeder has `lines` of a batch in flight (at most 30 s)."""
    deadline = time.monotonic() + 30
    while metric(url, "genq_batch_lines_inflight") < lines:
        assert time.monotonic() < deadline
        time.sleep(0.05)

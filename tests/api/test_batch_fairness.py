"""Fair sharing between batches: the feeder's round-robin split of free capacity (a pure
function, table-driven), and two keys' batches through real processes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from api.batch_feeder import fair_shares
from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.test_batches import CHAT, chat_line, upload
from tests.api.test_openai import client_for
from tests.conftest import WorkerProcess


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
        big = alice.batches.create(input_file_id=upload(alice, b"".join(lines)), endpoint=CHAT,
                                   completion_window="24h")  # fmt: skip
        while alice.batches.retrieve(big.id).status != "in_progress":
            time.sleep(0.05)
        small = bob.batches.create(input_file_id=upload(bob, b"".join(lines[:4])), endpoint=CHAT,
                                   completion_window="24h")  # fmt: skip
        deadline = time.monotonic() + 60
        while (done := bob.batches.retrieve(small.id)).status != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        behind = alice.batches.retrieve(big.id)
        assert behind.status == "in_progress", behind
        assert behind.request_counts is not None and done.request_counts is not None  # optional in the SDK
        assert behind.request_counts.completed < 40, behind.request_counts
        assert done.request_counts.completed == 4

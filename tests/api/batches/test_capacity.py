"""The batch capacity rule and the weighted round-robin split of free capacity between keys and
their batches (api/batches/capacity.py): pure functions, table-driven."""

from __future__ import annotations

import pytest

from api.batches.capacity import batch_capacity, fair_shares


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

"""The batch scripts (shared/jobqueue/lua/batch_*.lua) as state machines: each case sets a batch's state in
a real Redis, runs one script, and checks the state after. The guards are what make two feeders
at once (or one retried after a crash) write each line's result exactly once. Each script call
may touch only the keys it declares (tests/shared/jobqueue/script_keys.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from shared import keys
from shared.batches import BatchStatus, NewBatch, result_file_id
from shared.files import FilePurpose, NewFile
from shared.jobqueue import scripts
from tests.shared.jobqueue.script_keys import redis_client

BATCH = "batch_" + "0" * 32
OWNER = "key-a"

__all__ = ["redis_client"]  # the fixture: its scripts run under the key check


def run(client: redis.Redis, name: str, keys_: list[str], args: list[Any]) -> Any:
    """Run a batch script as shared/batches.py does: batch_finish with the prelude (it asks for the
    keys its record names), the others bare (they touch only their KEYS)."""
    if name == "batch_finish":
        return scripts.Script(client, name)(keys=keys_, args=args)
    return client.register_script(scripts.plain(name))(keys=keys_, args=args)


def make_batch(client: redis.Redis, status: BatchStatus, **fields: str) -> None:
    new = NewBatch(BATCH, OWNER, "/v1/chat/completions", "file-" + "1" * 32, 1000.0, 2000.0, None)
    # Copied through items(): redis-py types `mapping` with a key type no dict[str, str] matches.
    client.hset(keys.batch(BATCH), mapping=dict((new.fields() | {"status": status.value} | fields).items()))
    client.expire(keys.batch(BATCH), 3600)
    client.zadd(keys.BATCHES_ACTIVE, {BATCH: 1000})


@pytest.mark.parametrize(
    ("before", "owner", "after", "answered"),
    [
        (BatchStatus.VALIDATING, OWNER, BatchStatus.CANCELLING, True),
        (BatchStatus.IN_PROGRESS, OWNER, BatchStatus.CANCELLING, True),
        (BatchStatus.FINALIZING, OWNER, BatchStatus.FINALIZING, True),  # too late: it finishes
        (BatchStatus.COMPLETED, OWNER, BatchStatus.COMPLETED, True),
        (BatchStatus.IN_PROGRESS, "key-b", BatchStatus.IN_PROGRESS, False),  # not the caller's
    ],
)
def test_cancel(
    redis_client: redis.Redis, before: BatchStatus, owner: str, after: BatchStatus, answered: bool
) -> None:
    make_batch(redis_client, before)
    reply = run(redis_client, "batch_cancel", [keys.batch(BATCH)], [owner, "1500.0"])
    assert bool(reply) is answered
    assert redis_client.hget(keys.batch(BATCH), "status") == after
    cancelled = after is BatchStatus.CANCELLING
    assert (redis_client.hget(keys.batch(BATCH), "cancelling_at") == "1500.0") is cancelled
    assert run(redis_client, "batch_cancel", [keys.batch("batch_missing")], [OWNER, "1"]) == []


@pytest.mark.parametrize(
    ("before", "after"),
    [(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS), (BatchStatus.CANCELLING, BatchStatus.CANCELLING)],
)
def test_validated_once(redis_client: redis.Redis, before: BatchStatus, after: BatchStatus) -> None:
    make_batch(redis_client, before)
    batch_keys = [keys.batch(BATCH), keys.owner_file_bytes(OWNER)]
    redis_client.set(keys.owner_file_bytes(OWNER), 1000)
    assert run(redis_client, "batch_validated", batch_keys, ["1100.0", 7, 2, 40]) == 1
    record = redis_client.hgetall(keys.batch(BATCH))
    assert (record["status"], record["total"], record["validated"], record["duplicates"]) == (
        after,
        "7",
        "1",
        "2",
    )
    assert redis_client.keys(keys.batch(BATCH) + ":*") == []  # no refused line is copied into Redis
    assert redis_client.hget(keys.batch(BATCH), "kept_bytes") == "40"
    assert redis_client.get(keys.owner_file_bytes(OWNER)) == "1040"  # its kept files count
    # A second feeder's validation of the same batch writes nothing, and charges nothing again.
    assert run(redis_client, "batch_validated", batch_keys, ["1200.0", 9, 0, 40]) == 0
    assert redis_client.hget(keys.batch(BATCH), "total") == "7"
    assert redis_client.get(keys.owner_file_bytes(OWNER)) == "1040"


def create_keys(batch_id: str) -> list[str]:
    return [
        keys.batch(batch_id),
        keys.owner_batches(OWNER),
        keys.BATCHES_ACTIVE,
        keys.owner_active_batches(OWNER),
    ]


def create_args(batch_id: str, now: float, active_max: int) -> list[Any]:
    new = NewBatch(batch_id, OWNER, "/v1/chat/completions", "file-" + "1" * 32, now, now + 100, None)
    fields = orjson.dumps([i for pair in new.fields().items() for i in pair]).decode()
    return [batch_id, fields, 3600, 7, now, now, active_max, now + 3600]


@pytest.mark.parametrize(
    ("active", "active_max", "made"),
    [
        ({}, 1, True),
        ({"batch_a": 5000.0}, 2, True),
        ({"batch_a": 5000.0, "batch_b": 5000.0}, 2, False),  # at the bound: nothing written
        ({"batch_a": 5000.0, "batch_b": 900.0}, 2, True),  # batch_b's record lapsed: it no longer counts
    ],
)
def test_create_counts_the_owners_active_batches(
    redis_client: redis.Redis, active: dict[str, float], active_max: int, made: bool
) -> None:
    if active:
        redis_client.zadd(keys.owner_active_batches(OWNER), active)
    assert (
        run(redis_client, "batch_create", create_keys(BATCH), create_args(BATCH, 1000.0, active_max)) == made
    )
    members = set(redis_client.zrange(keys.owner_active_batches(OWNER), 0, -1))
    kept = {batch_id for batch_id, score in active.items() if score > 1000.0}
    assert members == (kept | {BATCH} if made else kept)
    assert bool(redis_client.exists(keys.batch(BATCH))) is made
    assert (redis_client.zscore(keys.BATCHES_ACTIVE, BATCH) == 1000.0) is made
    assert (redis_client.zscore(keys.owner_batches(OWNER), BATCH) == 7.0) is made
    if made:
        assert redis_client.hget(keys.batch(BATCH), "status") == "validating"
        assert (
            redis_client.ttl(keys.batch(BATCH)) > 0 and redis_client.ttl(keys.owner_active_batches(OWNER)) > 0
        )


def feed_args(
    from_offset: str, to_offset: int, to_line: int, at_end: bool, entries: dict[int, str], rows: int = 0
) -> list[Any]:
    flat = [item for line, entry in entries.items() for item in (str(line), entry)]
    return [from_offset, to_offset, to_line, "1" if at_end else "0", orjson.dumps(flat), rows or len(entries)]


def test_feed_moves_the_cursor_only_from_where_it_was(redis_client: redis.Redis) -> None:
    make_batch(redis_client, BatchStatus.IN_PROGRESS)
    batch_keys = [keys.batch(BATCH), keys.batch_window(BATCH)]
    assert run(redis_client, "batch_feed", batch_keys, feed_args("0", 120, 2, False, {1: "a", 2: "b"})) == 1
    assert redis_client.hmget(keys.batch(BATCH), "cursor_offset", "cursor_line") == ["120", "2"]
    assert redis_client.hgetall(keys.batch_window(BATCH)) == {"1": "a", "2": "b"}
    # Another feeder that read from offset 0 too: nothing written.
    assert run(redis_client, "batch_feed", batch_keys, feed_args("0", 60, 1, False, {1: "other"})) == 0
    assert redis_client.hgetall(keys.batch_window(BATCH)) == {"1": "a", "2": "b"}
    assert run(redis_client, "batch_feed", batch_keys, feed_args("120", 180, 3, True, {3: "c"})) == 1
    assert redis_client.hget(keys.batch(BATCH), "input_done") == "1"
    assert redis_client.hget(keys.batch(BATCH), "window_rows") == "3"


def test_feed_and_commit_keep_the_windows_rows(redis_client: redis.Redis) -> None:
    """A line of n=8 costs 8 rows in the window until its result is committed."""
    make_batch(redis_client, BatchStatus.IN_PROGRESS)
    feed_keys = [keys.batch(BATCH), keys.batch_window(BATCH)]
    assert run(redis_client, "batch_feed", feed_keys, feed_args("0", 90, 2, False, {1: "a", 2: "b"}, 16)) == 1
    assert redis_client.hget(keys.batch(BATCH), "window_rows") == "16"
    commit_keys = [*feed_keys, keys.batch_parts(BATCH)]
    assert run(redis_client, "batch_commit", commit_keys, ["0", "part-0", 1, 0, 8, 1]) == 1
    assert redis_client.hget(keys.batch(BATCH), "window_rows") == "8"
    # Rows the record never counted (a window filled before they were) leave it at zero.
    assert run(redis_client, "batch_commit", commit_keys, ["1", "part-1", 1, 0, 9, 2]) == 1
    assert redis_client.hget(keys.batch(BATCH), "window_rows") == "0"


def test_commit_takes_each_part_number_once(redis_client: redis.Redis) -> None:
    make_batch(redis_client, BatchStatus.IN_PROGRESS)
    redis_client.hset(keys.batch_window(BATCH), mapping={"1": "a", "2": "b", "3": "c"})
    batch_keys = [keys.batch(BATCH), keys.batch_window(BATCH), keys.batch_parts(BATCH)]
    assert run(redis_client, "batch_commit", batch_keys, ["0", "part-0", 1, 1, 2, 1, 3]) == 1
    record = redis_client.hgetall(keys.batch(BATCH))
    assert (record["completed"], record["failed"], record["part_seq"]) == ("1", "1", "1")
    assert redis_client.hgetall(keys.batch_window(BATCH)) == {"2": "b"}
    assert redis_client.lrange(keys.batch_parts(BATCH), 0, -1) == ["part-0"]
    # A writer that expected part 0 too (another feeder, or this one retried): nothing written.
    assert run(redis_client, "batch_commit", batch_keys, ["0", "part-0b", 1, 0, 1, 2]) == 0
    assert redis_client.hgetall(keys.batch_window(BATCH)) == {"2": "b"}
    assert redis_client.lrange(keys.batch_parts(BATCH), 0, -1) == ["part-0"]


def finish_args(status: BatchStatus, output: NewFile | None, webhook: str = "") -> list[Any]:
    fields = orjson.dumps([i for pair in output.fields().items() for i in pair]).decode() if output else ""
    return [status.value, "1900.0", "", fields, "", 123, 0, webhook]


def finish_keys() -> list[str]:
    return [
        keys.batch(BATCH), keys.BATCHES_ACTIVE, keys.batch_window(BATCH), keys.owner_active_batches(OWNER),
        keys.batch_parts(BATCH), keys.file(result_file_id(BATCH, "output")),
        keys.file(result_file_id(BATCH, "error")), keys.owner_files(OWNER),
    ]  # fmt: skip


def test_finish_ends_a_batch_once_with_its_files(redis_client: redis.Redis) -> None:
    make_batch(redis_client, BatchStatus.FINALIZING, kept_bytes="40")
    redis_client.set(keys.owner_file_bytes(OWNER), 1040)  # its input file's 1000 and its kept 40
    redis_client.zadd(keys.owner_active_batches(OWNER), {BATCH: 5000.0, "batch_other": 5000.0})
    redis_client.rpush(keys.batch_parts(BATCH), "part-0")
    output = NewFile(result_file_id(BATCH, "output"), OWNER, 10, 1900, "out.jsonl", FilePurpose.BATCH_OUTPUT)
    finished = finish_args(BatchStatus.COMPLETED, output, webhook="the delivery message")
    assert run(redis_client, "batch_finish", finish_keys(), finished) == 1
    assert redis_client.lrange(keys.queue_key(keys.WEBHOOK_QUEUE, 0), 0, -1) == ["the delivery message"]
    # ... and indexed as a pending delivery, so the reaper pushes it again were the broker to lose it.
    delivery = keys.BATCH_WEBHOOK_DELIVERY.format(batch_id=BATCH, event="batch.completed")
    assert redis_client.hget(delivery, "message") == "the delivery message"
    assert redis_client.zscore(keys.WEBHOOK_PENDING, delivery) == 1900.0 + scripts.ORPHAN_CHECK_S
    record = redis_client.hgetall(keys.batch(BATCH))
    assert (record["status"], record["completed_at"]) == ("completed", "1900.0")
    assert record["output_file_id"] == output.file_id and "error_file_id" not in record
    assert redis_client.hget(keys.file(output.file_id), "owner") == OWNER
    assert redis_client.zrange(keys.owner_files(OWNER), 0, -1) == [output.file_id]
    assert redis_client.zcard(keys.BATCHES_ACTIVE) == 0 and not redis_client.exists(keys.batch_parts(BATCH))
    assert redis_client.zrange(keys.owner_active_batches(OWNER), 0, -1) == ["batch_other"]  # its slot is free
    # The kept files' 40 bytes are released; the output file's 10 are charged.
    assert redis_client.get(keys.owner_file_bytes(OWNER)) == "1010"
    # Ended: a second finish (a feeder retried after a crash) changes nothing.
    assert (
        run(redis_client, "batch_finish", finish_keys(), finish_args(BatchStatus.CANCELLED, None, "m2")) == 0
    )
    assert redis_client.hget(keys.batch(BATCH), "status") == "completed"
    assert redis_client.llen(keys.queue_key(keys.WEBHOOK_QUEUE, 0)) == 1  # its webhook is sent once
    assert redis_client.get(keys.owner_file_bytes(OWNER)) == "1010"  # released once


@pytest.mark.parametrize(
    ("before", "moved"),
    [(BatchStatus.IN_PROGRESS, True), (BatchStatus.CANCELLING, False), (BatchStatus.FINALIZING, False)],
)
def test_finalizing_only_from_in_progress(
    redis_client: redis.Redis, before: BatchStatus, moved: bool
) -> None:
    make_batch(redis_client, before)
    assert run(redis_client, "batch_finalizing", [keys.batch(BATCH)], ["1800.0"]) == int(moved)
    assert (redis_client.hget(keys.batch(BATCH), "status") == "finalizing") is (
        moved or before is BatchStatus.FINALIZING
    )

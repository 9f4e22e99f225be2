"""api/jobs/follow.py: a job's output as typed events, against the running app's queue, the
suite's Redis, and a job driven through the worker's own store calls (tests/api/conftest.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from prometheus_client import REGISTRY

from api.edge.concurrency import Slot
from api.jobs import follow as follow_module
from api.jobs import streams
from api.jobs.follow import FINAL_ID, Done, Failure, Output, StreamEvent, follow, watched
from api.jobs.queue import JobQueue
from api.jobs.streams import START_ID
from api.routes.stream import open_stream
from shared import keys
from shared.errors import ConcurrencyLimited, NotFound
from shared.schemas import JobStatus
from tests.api.conftest import OWNER, ScriptedWorker, submitted

pytestmark = pytest.mark.anyio


async def all_events(
    queue: JobQueue, job_id: str, after_id: str = START_ID, owner: str = OWNER
) -> list[StreamEvent]:
    return [event async for event in follow(queue, job_id, owner, after_id)]


async def test_a_finished_jobs_events_are_its_entries_then_done(
    queue: JobQueue, scripted: ScriptedWorker
) -> None:
    job_id = await submitted(queue)
    scripted.claim(job_id)
    first = scripted.publish(job_id, "one", 1)
    second = scripted.publish(job_id, " two", 2)
    scripted.succeed(job_id, "one two", 2)
    events = await all_events(queue, job_id)
    assert events[:2] == [Output(first, "one", 1), Output(second, " two", 2)]
    assert len(events) == 3 and isinstance(events[2], Done)
    assert events[2].job["status"] is JobStatus.SUCCEEDED and events[2].job["id"] == job_id
    # Resuming after the first entry sends the rest, once.
    assert (await all_events(queue, job_id, first))[:-1] == [Output(second, " two", 2)]


async def test_text_the_stream_lacks_comes_as_one_final_output(
    queue: JobQueue, scripted: ScriptedWorker
) -> None:
    job_id = await submitted(queue)
    scripted.claim(job_id)
    scripted.publish(job_id, "one", 1)
    scripted.succeed(job_id, "one two three", 3)  # the last deltas never reached the stream
    events = await all_events(queue, job_id)
    assert events[1] == Output(FINAL_ID, " two three", 3)
    assert isinstance(events[2], Done)
    # After FINAL_ID nothing is sent again but the end.
    resumed = await all_events(queue, job_id, FINAL_ID)
    assert len(resumed) == 1 and isinstance(resumed[0], Done)


async def test_a_stream_that_is_no_prefix_of_the_text_leaves_the_text_to_done(
    queue: JobQueue, scripted: ScriptedWorker
) -> None:
    job_id = await submitted(queue)
    scripted.claim(job_id)
    entry = scripted.publish(job_id, "draft", 1)
    scripted.succeed(job_id, "final answer", 2)
    events = await all_events(queue, job_id)
    assert events[0] == Output(entry, "draft", 1)
    assert len(events) == 2 and isinstance(events[1], Done)


async def test_a_follower_of_a_queued_job_gets_its_entries_as_they_come(
    queue: JobQueue, scripted: ScriptedWorker
) -> None:
    """No poll interval in the way: the stream hub wakes the follower (the recheck is 15-30 s)."""
    job_id = await submitted(queue)
    events: list[tuple[float, StreamEvent]] = []

    async def collect() -> None:
        async for event in follow(queue, job_id, OWNER):
            events.append((time.monotonic(), event))

    following = asyncio.create_task(collect())
    await asyncio.sleep(0.3)  # the follower has read the empty stream and waits
    scripted.claim(job_id)
    published = time.monotonic()
    entry = scripted.publish(job_id, "live", 1)
    while not events:
        assert time.monotonic() - published < 3, "the entry never reached the follower"
        await asyncio.sleep(0.02)
    assert events[0][1] == Output(entry, "live", 1)
    scripted.succeed(job_id, "live", 1)
    await asyncio.wait_for(following, 5)
    assert isinstance(events[-1][1], Done) and events[-1][1].job["status"] is JobStatus.SUCCEEDED


def followed(queue: JobQueue, job_id: str) -> tuple[list[StreamEvent], asyncio.Task[None]]:
    """A follower of the job running in the background: the events it got so far, and its task."""
    events: list[StreamEvent] = []

    async def collect() -> None:
        async for event in follow(queue, job_id, OWNER):
            events.append(event)

    return events, asyncio.create_task(collect())


def calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def round_trips() -> float:
    """Pipelines the API's batched commands sent so far (the app's queue reads through them)."""
    return REGISTRY.get_sample_value("genq_api_redis_batch_commands_count") or 0.0


async def test_a_wake_for_new_entries_costs_one_read_of_the_stream_and_none_of_the_record(
    queue: JobQueue, scripted: ScriptedWorker, redis_client: redis.Redis
) -> None:
    """Each entry of a live job wakes its follower once, and the follower reads the stream once
    for it; the record is read again only when the job may have ended. (A wake used to cost two
    XRANGEs and an HGETALL: three times the commands of a streamed token batch.)"""
    job_id = await submitted(queue)
    events, following = followed(queue, job_id)
    scripted.claim(job_id)
    await asyncio.sleep(0.3)  # the follower has read the record and the empty stream, and waits
    reads = calls(redis_client, "xrange"), calls(redis_client, "hgetall")
    for number in range(1, 6):
        scripted.publish(job_id, f" {number}", number)
        deadline = time.monotonic() + 3
        while len(events) < number:
            assert time.monotonic() < deadline, f"entry {number} never reached the follower"
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert calls(redis_client, "xrange") - reads[0] == 5
    assert calls(redis_client, "hgetall") - reads[1] == 0
    scripted.succeed(job_id, " 1 2 3 4 5", 5)
    await asyncio.wait_for(following, 5)
    assert [e.delta for e in events if isinstance(e, Output)] == [" 1", " 2", " 3", " 4", " 5"]
    assert isinstance(events[-1], Done)


async def test_a_follower_woken_by_a_last_entry_and_the_end_together_reads_the_stream_once(
    queue: JobQueue, scripted: ScriptedWorker, redis_client: redis.Redis
) -> None:
    """A job's last deltas and its end come together (the worker writes them in one round trip):
    the record and the stream after it are read once, in one round trip (the stream used to be
    read for the entry, then again for the end; then after the record, in a round trip of its
    own)."""
    job_id = await submitted(queue)
    watching = await watched(queue, job_id, OWNER)
    events: list[StreamEvent] = []

    async def collect() -> None:
        async for event in follow(queue, job_id, OWNER, watching=watching):
            events.append(event)

    following = asyncio.create_task(collect())
    scripted.claim(job_id)
    await asyncio.sleep(0.3)  # the follower has read the empty stream and waits
    reads = calls(redis_client, "xrange"), calls(redis_client, "hgetall"), round_trips()
    entry = scripted.publish(job_id, "last", 1)
    scripted.succeed(job_id, "last", 1)
    watching.moved.set()  # both wakes before the follower runs, whatever order the hubs see them in
    watching.ended.set()
    await asyncio.wait_for(following, 5)
    assert len(events) == 2 and events[0] == Output(entry, "last", 1)
    assert isinstance(events[1], Done) and events[1].job["status"] is JobStatus.SUCCEEDED
    read = calls(redis_client, "xrange") - reads[0], calls(redis_client, "hgetall") - reads[1]
    assert read == (1, 1) and round_trips() - reads[2] == 1


async def test_a_stream_opened_on_an_ended_job_is_one_round_trip(
    queue: JobQueue, scripted: ScriptedWorker, redis_client: redis.Redis
) -> None:
    """The record and the stream are read together when a stream opens: for a job that already
    ended that read is the whole stream (every entry was written before the record turned
    terminal, and the stream is read after the record). It took two round trips before."""
    job_id = await submitted(queue)
    scripted.claim(job_id)
    first = scripted.publish(job_id, "one", 1)
    second = scripted.publish(job_id, " two", 2)
    scripted.succeed(job_id, "one two", 2)
    before = calls(redis_client, "xrange"), calls(redis_client, "hgetall"), round_trips()
    events = await all_events(queue, job_id)
    assert events[:2] == [Output(first, "one", 1), Output(second, " two", 2)]
    assert len(events) == 3 and isinstance(events[2], Done)
    read = calls(redis_client, "xrange") - before[0], calls(redis_client, "hgetall") - before[1]
    assert read == (1, 1) and round_trips() - before[2] == 1


async def test_a_resumed_stream_of_an_ended_job_sends_what_came_after_its_last_event(
    queue: JobQueue, scripted: ScriptedWorker, redis_client: redis.Redis
) -> None:
    """Last-Event-ID on a job that ended: the entries after it, the text the stream lacks, Done.
    Through the route, the entries come with the record (one round trip) and the stream before the
    cursor is read once more, for the text it lacks; a follower handed a read made for another
    cursor reads after its own."""
    job_id = await submitted(queue)
    scripted.claim(job_id)
    first = scripted.publish(job_id, "one", 1)
    second = scripted.publish(job_id, " two", 2)
    scripted.succeed(job_id, "one two three", 3)
    expected = [Output(second, " two", 2), Output(FINAL_ID, " three", 3)]
    before = round_trips()
    response = await open_stream(queue, job_id, OWNER, first)
    body = b"".join([bytes(chunk) async for chunk in response.body_iterator])  # type: ignore[arg-type]
    assert round_trips() - before == 2
    assert body.count(b"event: output") == 2 and f"id: {second}".encode() in body and b" three" in body
    assert b"event: done" in body and b'"one"' not in body
    watching = await watched(queue, job_id, OWNER)  # read from the start
    events = [event async for event in follow(queue, job_id, OWNER, first, watching)]
    assert events[:-1] == expected and isinstance(events[-1], Done)


async def test_a_full_page_read_with_the_end_is_followed_by_the_rest_of_the_stream(
    queue: JobQueue, scripted: ScriptedWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read that sees the job ended holds one page of entries: when it is full, the rest is
    read before the text the stream lacks and Done, from the start and when resumed."""
    monkeypatch.setattr(streams, "READ_COUNT", 2)
    monkeypatch.setattr(follow_module, "READ_COUNT", 2)
    job_id = await submitted(queue)
    scripted.claim(job_id)
    ids = [scripted.publish(job_id, letter, number) for number, letter in enumerate("abcde", 1)]
    scripted.succeed(job_id, "abcdef", 6)  # "f" never reached the stream
    events = await all_events(queue, job_id)
    outputs = [
        Output(entry, letter, number)
        for number, (entry, letter) in enumerate(zip(ids, "abcde", strict=True), 1)
    ]
    assert events[:-1] == [*outputs, Output(FINAL_ID, "f", 6)] and isinstance(events[-1], Done)
    resumed = await all_events(queue, job_id, ids[1])
    assert resumed[:-1] == [*outputs[2:], Output(FINAL_ID, "f", 6)] and isinstance(resumed[-1], Done)


async def test_entries_without_a_message_still_reach_the_follower_at_the_jobs_end(
    queue: JobQueue, scripted: ScriptedWorker, redis_client: redis.Redis
) -> None:
    """A worker older than the output channel (a rolling upgrade, docs/operations.md) adds entries
    without naming the job: nothing wakes the follower for them, but the job's end does, and it
    then gets every entry and Done, not only after its 15-30 s re-read."""
    job_id = await submitted(queue)
    events, following = followed(queue, job_id)
    await asyncio.sleep(0.3)  # the follower has read the empty stream and waits
    scripted.claim(job_id)
    entry = str(redis_client.xadd(keys.job_stream(job_id), {"delta": "quiet", "tokens": 1}))
    await asyncio.sleep(0.3)
    assert events == []  # no message, no wake
    scripted.succeed(job_id, "quiet", 1)
    await asyncio.wait_for(following, 5)
    assert events[0] == Output(entry, "quiet", 1) and isinstance(events[-1], Done)


async def test_a_job_that_vanishes_or_is_not_the_callers_ends_in_not_found(
    queue: JobQueue, redis_client: redis.Redis
) -> None:
    job_id = await submitted(queue)
    assert await all_events(queue, job_id, owner="key-someone-else") == [
        Failure("not_found", f"job {job_id!r} no longer exists (it expired or was removed)")
    ]
    redis_client.delete(keys.job(job_id))
    events = await all_events(queue, job_id)
    assert len(events) == 1 and isinstance(events[0], Failure) and events[0].type == "not_found"


def registered(queue: JobQueue, job_id: str) -> bool:
    """Whether either hub still holds a wake-up for the job. Their registries are private; a
    stream that ended without unregistering would leave its job there (and keep the stream hub
    subscribed) for the life of the process."""
    return job_id in queue._hub._waiters or job_id in queue._events._waiters


async def test_a_stream_its_route_opens_reads_the_record_once_and_leaves_nothing_registered(
    queue: JobQueue, scripted: ScriptedWorker, redis_client: redis.Redis
) -> None:
    """open_stream's 404 check is the read the stream starts from: it registers the follower's
    wake-ups first, so no second read is needed (it read the record twice before)."""
    job_id = await submitted(queue)
    scripted.claim(job_id)
    scripted.publish(job_id, "one", 1)
    scripted.succeed(job_id, "one", 1)
    reads = calls(redis_client, "hgetall")
    response = await open_stream(queue, job_id, OWNER, None)
    body = b"".join(
        [chunk if isinstance(chunk, bytes) else str(chunk).encode() async for chunk in response.body_iterator]
    )
    assert calls(redis_client, "hgetall") - reads == 1
    assert body.startswith(b"id: ") and b"event: output" in body and b"event: done" in body
    assert not registered(queue, job_id)


async def test_a_live_stream_whose_body_never_starts_unregisters_by_its_background_task(
    queue: JobQueue, scripted: ScriptedWorker
) -> None:
    """A client that leaves before the first byte: the body generator never runs its `finally`,
    so the response's background task gives back the slot and the wake-ups."""
    job_id = await submitted(queue)
    scripted.claim(job_id)
    response = await open_stream(queue, job_id, OWNER, None)
    assert registered(queue, job_id)
    assert response.background is not None
    await response.background()
    assert not registered(queue, job_id)
    # The slot is back: the owner may hold as many streams as before.
    assert_all_stream_slots_free(queue)


async def test_a_refused_stream_leaves_nothing_registered(queue: JobQueue) -> None:
    """404 (someone else's job) and 429 (the owner holds its open streams' limit) come before the
    stream starts, and take back what the open registered."""
    job_id = await submitted(queue)
    with pytest.raises(NotFound):
        await open_stream(queue, job_id, "key-someone-else", None)
    assert not registered(queue, job_id)
    held = hold_every_stream_slot(queue)
    try:
        with pytest.raises(ConcurrencyLimited):
            await open_stream(queue, job_id, OWNER, None)
        assert not registered(queue, job_id)
    finally:
        for slot in held:
            slot.release()


def hold_every_stream_slot(queue: JobQueue) -> list[Slot]:
    held: list[Slot] = []
    with pytest.raises(ConcurrencyLimited):
        while True:
            held.append(queue.hold(OWNER, "streams"))
    return held


def assert_all_stream_slots_free(queue: JobQueue) -> None:
    held = hold_every_stream_slot(queue)
    for slot in held:
        slot.release()
    assert len(held) == queue._settings.max_streams_per_key

"""Follows one job's output as a closed set of typed events, whatever wire format carries them
(the /v1/jobs/{id}/stream SSE endpoint, OpenAI-style streaming).

The worker XADDs deltas to the job's Redis Stream and flushes the last one BEFORE the record turns
terminal. So: read what is there (late join), then sleep until the process's stream hub
(api/jobs/stream_hub.py: one pub/sub subscription for all followers) says new entries came, or the
events hub says the job ended: new entries are read with one short XRANGE, and the job's end (or
RECHECK_S without news) is read from the record, first when both woke it (a job's last deltas and
its end come in one round trip of its worker). Once the record is terminal, one more read drains
everything left, and `Done` follows. No follower ever holds a Redis connection while it waits. A job
that ended with text its stream lacks gets that text as one last `Output` with id FINAL_ID: the
text generated after the engine's last (throttled) update of a job is in its record only, and so is
all of a cached job's, or what a worker could not publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from api.jobs.events import set_within
from api.jobs.queue import JobQueue
from api.jobs.streams import READ_COUNT, START_ID, OutputEntry, entry_order
from shared.errors import NotFound
from shared.logging import fields
from shared.schemas import JobStatus, JobView

log = logging.getLogger("genq.api")

#: Id of the output event that carries text the stream lacked; resuming after it sends only `Done`.
FINAL_ID = "final"
#: The record is re-read at least this often (jittered down to half), whatever the hubs say. The
#: events hub wakes followers when their job ends, and wakes all of them after it reconnected, so
#: this only bounds the delay of a lost message: an idle stream costs two commands (XRANGE and
#: HGETALL, autopipelined) per 15-30 s, and nothing in between but its pings.
RECHECK_S = 30.0
#: A comment is sent after this long without any event, so proxies keep the connection open.
HEARTBEAT_S = 15.0


@dataclass(frozen=True, slots=True)
class Output:
    """New text: `delta`, with `tokens` completion tokens generated so far, of completion `index`
    (OpenAI's n), and the new tokens' log-probability entries when the job asked for them."""

    id: str
    delta: str
    tokens: int
    index: int = 0
    logprobs: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The job ended; `job` is the job object as GET returns it."""

    job: JobView


@dataclass(frozen=True, slots=True)
class Failure:
    """The stream cannot go on (the job vanished, Redis is unreachable)."""

    type: str
    message: str


@dataclass(frozen=True, slots=True)
class Ping:
    """Nothing happened for HEARTBEAT_S."""


StreamEvent = Output | Done | Failure | Ping


class Watched:
    """A job read after its follower's wake-ups were registered: where a stream starts. Reading
    after registering is what makes the first read enough (a job that ends during it still wakes
    the follower), so a route that must answer 404 before its stream starts (api/routes/stream.py)
    opens this and hands it to follow() instead of reading the record a second time.

    close() unregisters the wake-ups; it may run more than once (the stream's end, and a response
    whose body never started)."""

    def __init__(
        self,
        owner: str,
        job: JobView,
        woken: asyncio.Event,
        moved: Relay,
        ended: Relay,
        registered: contextlib.ExitStack,
    ) -> None:
        self.owner, self.job = owner, job
        #: Set by either hub; `moved` (new stream entries) and `ended` (the record may be
        #: terminal) say which.
        self.woken, self.moved, self.ended = woken, moved, ended
        self.registered = registered

    def close(self) -> None:
        self.registered.close()


async def watched(queue: JobQueue, job_id: str, owner: str) -> Watched:
    """Registers a follower's wake-ups with both hubs, then reads the job: NotFound (unknown, or
    someone else's) leaves nothing registered."""
    woken = asyncio.Event()
    moved, ended = Relay(woken), Relay(woken)
    with contextlib.ExitStack() as registering:
        registering.enter_context(queue.watch(job_id, ended))
        registering.enter_context(queue.follow_stream(job_id, moved))
        job = await queue.get(job_id, owner)
        return Watched(owner, job, woken, moved, ended, registering.pop_all())


async def follow(
    queue: JobQueue, job_id: str, owner: str, after_id: str = START_ID, watching: Watched | None = None
) -> AsyncIterator[StreamEvent]:
    """The job's output after entry `after_id`, then `Done`, or a `Failure` that ends it. From
    `watching` when the caller opened it (and then this closes it), else from a fresh one."""
    try:
        if watching is None:
            watching = await watched(queue, job_id, owner)
        with contextlib.closing(watching):
            async for event in _follow(queue, watching, after_id):
                yield event
    except NotFound:
        yield Failure("not_found", f"job {job_id!r} no longer exists (it expired or was removed)")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        log.warning("stream_redis_unavailable", extra=fields(job_id=job_id, error=str(exc)))
        yield Failure("unavailable", "the job store (Redis) is unreachable; reconnect with Last-Event-ID")


async def _follow(queue: JobQueue, watching: Watched, after_id: str) -> AsyncIterator[StreamEvent]:
    loop = asyncio.get_running_loop()
    job, cursor = watching.job, after_id
    job_id, owner = job["id"], watching.owner
    woken, moved, ended = watching.woken, watching.moved, watching.ended
    if cursor == FINAL_ID and not job["status"].is_terminal():
        cursor = START_ID  # FINAL_ID is only handed out once a job ended: not one of ours
    next_check = loop.time() + _recheck_s()
    quiet_since = loop.time()
    moved.set()  # what the stream holds already (a late join)
    while not job["status"].is_terminal():
        if loop.time() >= next_check:  # no news for a while: read both, lest a message was lost
            moved.set()
            ended.set()
            next_check = loop.time() + _recheck_s()
        if ended.is_set():  # first: the stream of a job that ended is read once, by _finish
            ended.clear()
            job = await queue.get(job_id, owner)
            if job["status"].is_terminal():
                break
        if moved.is_set():
            moved.clear()  # before the read: an entry added during it sets it again
            entries = await queue.stream_entries(job_id, cursor)
            for entry in entries:
                cursor = entry.id
                quiet_since = loop.time()
                yield _output(entry)
            if len(entries) >= READ_COUNT:
                moved.set()  # a full page: there may be more
        # Idle: no Redis command until a hub wakes it or the recheck is due; pings meanwhile.
        woken.clear()
        while not (moved.is_set() or ended.is_set() or loop.time() >= next_check):
            wake_in = min(next_check, quiet_since + HEARTBEAT_S) - loop.time()
            await set_within(woken, wake_in)
            if loop.time() - quiet_since >= HEARTBEAT_S:
                quiet_since = loop.time()
                yield Ping()
    async for event in _finish(queue, job, cursor):
        yield event


class Relay(asyncio.Event):
    """An event that also sets `also` when set: a follower sleeps on one event for two hubs and
    still knows which of them woke it (a wake for new entries used to cost a re-read of the stream
    and of the record besides the read it needed)."""

    def __init__(self, also: asyncio.Event) -> None:
        super().__init__()
        self._also = also

    def set(self) -> None:
        super().set()
        self._also.set()


def _recheck_s() -> float:
    # Jittered, so streams opened together do not re-read together.
    return RECHECK_S * random.uniform(0.5, 1.0)


async def _finish(queue: JobQueue, job: JobView, cursor: str) -> AsyncIterator[StreamEvent]:
    """After the record turned terminal: the entries left after `cursor`, any text the stream
    lacks, then Done."""
    if cursor != FINAL_ID:
        entries = await queue.stream_entries(job["id"], START_ID)
        after = entry_order(cursor)
        for entry in entries:
            if entry_order(entry.id) > after:
                yield _output(entry)
        missing = _missing_text(job, entries)
        if missing:
            yield Output(FINAL_ID, missing, _completion_tokens(job))
    yield Done(job)


def _output(entry: OutputEntry) -> Output:
    return Output(entry.id, entry.delta, entry.tokens, entry.index, entry.logprobs)


def _missing_text(job: JobView, entries: list[OutputEntry]) -> str:
    """The end of a succeeded job's text (its first completion's) that its stream never carried
    ('' when none, or when the stream is no prefix of it: then the `Done` job's output is the
    authority)."""
    output = job.get("output") or {}
    text = str(output.get("text") or "")
    streamed = "".join(entry.delta for entry in entries if entry.index == 0)
    if job["status"] is not JobStatus.SUCCEEDED or not text.startswith(streamed):
        return ""
    return text[len(streamed) :]


def _completion_tokens(job: JobView) -> int:
    usage = (job.get("output") or {}).get("usage") or {}
    return int(usage.get("completion_tokens") or 0)

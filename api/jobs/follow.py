"""Follows one job's output as a closed set of typed events, whatever wire format carries them
(the /v1/jobs/{id}/stream SSE endpoint, OpenAI-style streaming).

The worker appends deltas to the job's Redis Stream and flushes the last one before the record
turns terminal. So a follower reads the record and the stream (a late join), then sleeps until
the stream hub (api/jobs/stream_hub.py) says new entries came, or the events hub says the job
ended, or RECHECK_S passes; it then reads the new entries, or the record and the rest of the
stream in one round trip (JobQueue.get_with_entries). No follower holds a Redis connection while
it waits. Text the record holds and the stream lacks (generated after the engine's last throttled
update, or a cached job's) comes as one last `Output` with id FINAL_ID."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.exceptions

from api.jobs.events import set_within
from api.jobs.queue import JobQueue
from api.jobs.streams import READ_COUNT, START_ID, OutputEntry
from shared.errors import NotFound
from shared.logging import fields
from shared.schemas import JobStatus, JobView, TokenLogprob

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
    logprobs: list[TokenLogprob] | None = None


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
    opens this and hands it to follow() instead of reading the record a second time. The first
    page of the job's stream after `entries_after` is read with the record, in the same round trip.

    close() unregisters the wake-ups; it may run more than once (the stream's end, and a response
    whose body never started)."""

    def __init__(
        self,
        owner: str,
        read: tuple[JobView, list[OutputEntry]],
        entries_after: str,
        woken: asyncio.Event,
        relays: tuple[Relay, Relay],
        registered: contextlib.ExitStack,
    ) -> None:
        self.owner = owner
        self.job, self.entries = read
        self.entries_after = entries_after
        #: Set by either hub; `moved` (new stream entries) and `ended` (the record may be
        #: terminal) say which.
        self.woken = woken
        self.moved, self.ended = relays
        self.registered = registered

    def close(self) -> None:
        self.registered.close()


async def watched(queue: JobQueue, job_id: str, owner: str, after_id: str = START_ID) -> Watched:
    """Registers a follower's wake-ups with both hubs, then reads the job and the entries after
    `after_id` (all of them for FINAL_ID: it is no entry): NotFound (unknown, or someone else's)
    leaves nothing registered."""
    woken = asyncio.Event()
    moved, ended = Relay(woken), Relay(woken)
    entries_after = START_ID if after_id == FINAL_ID else after_id
    with contextlib.ExitStack() as registering:
        registering.enter_context(queue.watch(job_id, ended))
        registering.enter_context(queue.follow_stream(job_id, moved))
        read = await queue.get_with_entries(job_id, owner, entries_after)
        return Watched(owner, read, entries_after, woken, (moved, ended), registering.pop_all())


async def follow(
    queue: JobQueue, job_id: str, owner: str, after_id: str = START_ID, watching: Watched | None = None
) -> AsyncIterator[StreamEvent]:
    """The job's output after entry `after_id`, then `Done`, or a `Failure` that ends it. From
    `watching` when the caller opened it (and then this closes it), else from a fresh one."""
    try:
        if watching is None:
            watching = await watched(queue, job_id, owner, after_id)
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
    job = watching.job
    if after_id == FINAL_ID and job["status"].is_terminal():
        yield Done(job)  # all of it was sent: FINAL_ID is the last output event
        return
    # FINAL_ID of a job not over is not one of ours: from the start.
    sent = _Sent(START_ID if after_id == FINAL_ID else after_id)
    job_id, owner = job["id"], watching.owner
    woken, moved, ended = watching.woken, watching.moved, watching.ended
    entries = watching.entries
    if watching.entries_after != sent.cursor:  # opened for another cursor: read after this one
        entries = await queue.stream_entries(job_id, sent.cursor)
    next_check = loop.time() + _recheck_s()
    quiet_since = loop.time()
    while True:
        for entry in entries:
            quiet_since = loop.time()
            yield sent.output(entry)
        full, entries = len(entries) >= READ_COUNT, []
        if job["status"].is_terminal():
            break
        if full:
            moved.set()  # there may be more
        if loop.time() >= next_check:  # no news for a while: read both, lest a message was lost
            moved.set()
            ended.set()
            next_check = loop.time() + _recheck_s()
        if ended.is_set():
            ended.clear()
            moved.clear()  # the read reads the stream too (an entry added during it sets it again)
            job, entries = await queue.get_with_entries(job_id, owner, sent.cursor)
            continue
        if moved.is_set():
            moved.clear()  # before the read: an entry added during it sets it again
            entries = await queue.stream_entries(job_id, sent.cursor)
            continue
        # Idle: no Redis command until a hub wakes it or the recheck is due; pings meanwhile.
        woken.clear()
        while not (moved.is_set() or ended.is_set() or loop.time() >= next_check):
            wake_in = min(next_check, quiet_since + HEARTBEAT_S) - loop.time()
            await set_within(woken, wake_in)
            if loop.time() - quiet_since >= HEARTBEAT_S:
                quiet_since = loop.time()
                yield Ping()
    async for event in _finish(queue, job, sent, full):
        yield event


class _Sent:
    """What a follower sent: the last entry's id, and the text of the job's first completion
    when it sent the stream from its start (None after a resume: an earlier connection got what
    came before)."""

    def __init__(self, cursor: str) -> None:
        self.cursor = cursor
        self.text: list[str] | None = [] if cursor == START_ID else None

    def output(self, entry: OutputEntry) -> Output:
        self.cursor = entry.id
        if self.text is not None and entry.index == 0:
            self.text.append(entry.delta)
        return Output(entry.id, entry.delta, entry.tokens, entry.index, entry.logprobs)


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


async def _finish(queue: JobQueue, job: JobView, sent: _Sent, more: bool) -> AsyncIterator[StreamEvent]:
    """After the record turned terminal and the entries read with it were sent: the rest of the
    stream when that page was full, any text the stream lacks, then Done."""
    if more:
        for entry in await queue.stream_entries(job["id"], sent.cursor):
            yield sent.output(entry)
    if sent.text is not None:
        streamed = "".join(sent.text)
    else:  # resumed: what the stream carried before the cursor is read back
        entries = await queue.stream_entries(job["id"], START_ID)
        streamed = "".join(entry.delta for entry in entries if entry.index == 0)
    missing = _missing_text(job, streamed)
    if missing:
        yield Output(FINAL_ID, missing, _completion_tokens(job))
    yield Done(job)


def _missing_text(job: JobView, streamed: str) -> str:
    """The end of a succeeded job's text (its first completion's) that its stream never carried
    ('' when none, or when the stream's text is no prefix of it: then the `Done` job's output
    is the authority)."""
    output = job["output"]
    text = "" if output is None else output["text"]
    if job["status"] is not JobStatus.SUCCEEDED or not text.startswith(streamed):
        return ""
    return text[len(streamed) :]


def _completion_tokens(job: JobView) -> int:
    output = job["output"]
    return 0 if output is None else output["usage"]["completion_tokens"]

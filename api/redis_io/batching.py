"""Automatic pipelining: the commands that concurrent requests issue in the same event-loop turn go
to Redis together, and each reply (or error) goes back to its own caller (what ioredis's
`enableAutoPipelining` does).

Why: redis-py spends as much CPU on each command sent alone (pool checkout, connect check, a
timeout context around each read) as uvicorn does on a whole request, and the API has dozens of
requests in flight, each waiting on one command. A batch pays that once for all of its commands.

How: each command is queued with a future; at the end of the turn the queue goes out as one batch
(MAX_BATCH commands at most) through a `Link`: one connection the API reads itself (wire.py, the
fenced adapter, while redis-py allows it), or redis-py's own `pipeline(transaction=False)`
(`PipelineLink`, its public API). A link may bound the batches out at once (pipelines: each holds
a pooled connection); the commands issued meanwhile wait and go out together, so a busier API
sends fuller batches rather than more of them. Each command keeps its own reply or error reply
(this is no transaction); an argument redis-py refuses to encode fails its own command only.
Never send blocking commands (BLPOP, XREAD BLOCK) here: they would hold up the replies of everyone
in their batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, NoScriptError

from shared.metrics import REDIS_BATCH

#: The most commands one batch carries; more in one turn go out as several batches.
MAX_BATCH = 256
#: The most pipelines out at once (each holds a pooled connection until its replies are read).
MAX_IN_FLIGHT = 4

#: A queued command: its arguments, its caller's future, and whether the command after it must
#: go in the same batch (execute_in_order).
Queued = tuple[tuple[Any, ...], "asyncio.Future[Any]", bool]


class Link(Protocol):
    """Where batches go. send() settles every future of its batch, each with its command's reply
    or error; the future it returns (None if the link bounds nothing) is done once they all are."""

    #: The most batches out at once (None: no bound).
    max_in_flight: int | None

    def send(self, batch: list[Queued]) -> asyncio.Future[None] | None: ...

    async def aclose(self) -> None: ...


class BatchedCommands:
    """Commands sent in batches shared by the requests of the same event-loop turn, through
    `link` (redis-py's pipelines unless given another)."""

    def __init__(self, client: aioredis.Redis, link: Link | None = None, max_batch: int = MAX_BATCH) -> None:
        self._client = client
        self._link = link if link is not None else PipelineLink(client)
        self._max_batch = max_batch
        self._pending: list[Queued] = []
        self._flush_scheduled = False
        self._in_flight: set[asyncio.Future[None]] = set()

    async def execute(self, *args: Any) -> Any:
        """Run one command (its name, then its arguments) and return its parsed reply, as
        `client.execute_command(*args)` would."""
        return await self._queued(args, joined=False)

    async def execute_in_order(self, *commands: Sequence[Any]) -> list[Any]:
        """Several commands, in this order in one pipeline, so Redis runs each after the one before
        it (not atomically: another client's command may run in between): a read placed after
        another sees what that one saw, or newer. One round trip for all. Their replies, in order,
        once all came; the first error among them is raised."""
        last = len(commands) - 1
        replies = await asyncio.gather(
            *(self._queued(tuple(c), joined=i < last) for i, c in enumerate(commands)),
            return_exceptions=True,
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """EVALSHA of a registered script, loading it first if the server does not know it yet
        (after a restart or SCRIPT FLUSH), as redis-py's Script.__call__ does."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        """Return once the commands queued so far have their replies (their callers wait for
        them); then the link closes what it holds of its own."""
        while self._pending or self._in_flight:
            if self._in_flight:
                await asyncio.wait(self._in_flight)
            else:
                await asyncio.sleep(0)  # the flush scheduled for them runs
        await self._link.aclose()

    def _queued(self, args: tuple[Any, ...], joined: bool) -> asyncio.Future[Any]:
        """A future for the reply to `args`, which goes out at the end of this turn (or when a
        batch comes back, if the link has as many out as it takes)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((args, future, joined))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        bound = self._link.max_in_flight
        while self._pending and (bound is None or len(self._in_flight) < bound):
            batch = self._take()
            if batch:
                done = self._link.send(batch)
                if done is not None:
                    self._in_flight.add(done)
                    done.add_done_callback(self._landed)

    def _landed(self, done: asyncio.Future[None]) -> None:
        self._in_flight.discard(done)
        self._flush()  # what waited for a batch to come back

    def _take(self) -> list[Queued]:
        """The next batch's commands off the queue: up to MAX_BATCH, more rather than part of an
        in-order group; none whose caller is gone."""
        pending = self._pending
        end = min(len(pending), self._max_batch)
        while end < len(pending) and pending[end - 1][2]:
            end += 1
        batch, self._pending = pending[:end], pending[end:]
        return [queued for queued in batch if not queued[1].done()]


class PipelineLink:
    """Batches as redis-py pipelines (`transaction=False`): its public API, a pooled connection per
    pipeline, MAX_IN_FLIGHT out at a time. What ends a pipeline's read (a lost connection,
    `socket_timeout`, a LOADING reply, a reply that is no UTF-8) fails every command of it, as it
    would fail a single command; the pool connects again for the next."""

    def __init__(self, client: aioredis.Redis, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._client = client
        self.max_in_flight: int | None = max_in_flight

    def send(self, batch: list[Queued]) -> asyncio.Future[None]:
        return asyncio.create_task(self._run(batch))

    async def aclose(self) -> None:
        """Nothing of its own to close: the connections are the client's pool's."""

    async def _run(self, batch: list[Queued]) -> None:
        """Send one pipeline and settle its commands' futures."""
        try:
            sent, replies = await self._sent(batch)
        except Exception as exc:
            fail_all(batch, exc)
        else:
            for (_, future, _), reply in zip(sent, replies, strict=True):
                if future.done():  # its caller is gone
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        finally:
            for _, future, _ in batch:
                future.cancel()  # no-op for those settled: only a cancel of this task gets here

    async def _sent(self, batch: list[Queued]) -> tuple[list[Queued], list[Any]]:
        """The commands sent and their replies (a reply that is an error reply is its exception).
        redis-py packs a whole pipeline before writing any of it: a command whose argument it
        refuses fails alone, and the others go out without it."""
        try:
            return batch, await self._pipelined(batch)
        except (DataError, UnicodeEncodeError):
            if not self._refuse_unencodable(batch):
                raise
        sent = [queued for queued in batch if not queued[1].done()]
        return sent, (await self._pipelined(sent) if sent else [])

    async def _pipelined(self, batch: list[Queued]) -> list[Any]:
        REDIS_BATCH.observe(len(batch))
        pipe = self._client.pipeline(transaction=False)
        for args, _, _ in batch:
            pipe.execute_command(*args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    def _refuse_unencodable(self, batch: list[Queued]) -> bool:
        """Fail each command with an argument redis-py's encoder refuses (DataError: a bool or None;
        UnicodeEncodeError: a str that is no UTF-8) with that error. Whether there was one."""
        encode = self._client.get_encoder().encode  # type: ignore[no-untyped-call]  # unannotated in redis-py
        refused = False
        for args, future, _ in batch:
            try:
                for arg in args:
                    encode(arg)
            except (DataError, UnicodeEncodeError) as exc:
                refused = True
                if not future.done():
                    future.set_exception(exc)
        return refused


def fail_all(batch: list[Queued], error: Exception) -> None:
    """Every command of the batch still waited for fails with `error`."""
    for _, future, _ in batch:
        if not future.done():
            future.set_exception(error)

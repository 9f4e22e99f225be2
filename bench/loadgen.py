"""HTTP/1.1 load over raw asyncio sockets: open loop (a fixed send schedule) and closed loop.

wrk2 (open-loop wrk) is not packaged in Debian, and Python HTTP clients (httpx, aiohttp) spend
more CPU per request than the servers they would measure here, so the benchmarks drive the API
with this: keep-alive connections, prebuilt request bytes, a minimal response parser (status and
Content-Length, which uvicorn always sends for these endpoints).

Open loop (`open_loop`): request i is due at t0 + i / rate whatever the server does; a due request
waits for a free connection if all are busy, and its latency counts from when it was due, not when
it was sent, so a slow server cannot hide its stalls (no coordinated omission; what wrk2 does).
Times come from time.perf_counter(): uvloop's loop.time() has millisecond resolution. Python's
cyclic GC is paused for a run (see `collector_paused`).
Closed loop (`closed_loop`): each connection sends its next request when the last one returns, and
latency counts from the send.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

_HEADER_END = b"\r\n\r\n"
_CONTENT_LENGTH = b"content-length:"
_CHUNKED = b"transfer-encoding: chunked"
#: The open loop sends what is due at most this often.
SEND_TICK_S = 0.001


def http_request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
) -> bytes:
    """The bytes of one keep-alive HTTP/1.1 request."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_post(path: str, body: bytes, headers: Mapping[str, str] | None = None) -> bytes:
    return http_request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    #: Empty unless the run keeps bodies.
    body: bytes
    latency_ms: float


@dataclass
class LoadResult:
    """What one run saw. `duration_s` runs from the first due time to the last reply."""

    sent: int = 0
    replies: list[Reply] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    duration_s: float = 0.0

    @property
    def completed(self) -> int:
        return len(self.replies)

    @property
    def unfinished(self) -> int:
        return self.sent - self.completed

    def latencies_ms(self, ok: Container[int] = range(200, 300)) -> list[float]:
        return [reply.latency_ms for reply in self.replies if reply.status in ok]

    def rate(self, ok: Container[int] = range(200, 300)) -> float:
        """Successful replies per second."""
        return len(self.latencies_ms(ok)) / self.duration_s if self.duration_s > 0 else 0.0


class _Connection(asyncio.Protocol):
    """One keep-alive connection; hands each complete response to `on_reply`."""

    def __init__(
        self,
        on_reply: Callable[[_Connection, int, bytes], None],
        on_lost: Callable[[Exception | None], None] | None = None,
    ) -> None:
        self._on_reply = on_reply
        self._on_lost = on_lost
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._on_lost is not None:
            self._on_lost(exc)

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(_HEADER_END)) >= 0:
            head = bytes(self._buffer[:end]).lower()
            start = end + len(_HEADER_END)
            if _CHUNKED in head:  # a streamed response (Server-Sent Events): whole once it ended
                found = _chunked_body(self._buffer, start)
                if found is None:
                    return
                body, total = found
            else:
                total = start + _content_length(head)
                if len(self._buffer) < total:
                    return
                body = bytes(self._buffer[start:total])
            del self._buffer[:total]
            self._on_reply(self, int(head[9:12]), body)


def _chunked_body(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """A chunked body that starts at `start` and where it ends, or None while it has not ended (no
    trailers: the servers measured send none)."""
    chunks: list[bytes] = []
    at = start
    while (line_end := buffer.find(b"\r\n", at)) >= 0:
        size = int(bytes(buffer[at:line_end]).split(b";", 1)[0], 16)
        data_start = line_end + 2
        if len(buffer) < data_start + size + 2:
            return None
        if size == 0:
            return b"".join(chunks), data_start + 2
        chunks.append(bytes(buffer[data_start : data_start + size]))
        at = data_start + size + 2
    return None


def _content_length(head: bytes) -> int:
    start = head.find(_CONTENT_LENGTH)
    if start < 0:
        raise ValueError(f"a response without Content-Length: {head[:200]!r}")
    end = head.find(b"\r\n", start)
    return int(head[start + len(_CONTENT_LENGTH) : end if end >= 0 else len(head)])


class Pool:
    """Connections that take requests from one backlog in order; replies go to `result`.

    `submit(request, due)`: with `due` (a perf_counter time) latency counts from then (open loop);
    without, from the moment the request is written (closed loop).
    """

    def __init__(self, host: str, port: int, connections: int, keep_bodies: bool = False) -> None:
        self.host, self.port, self.size = host, port, connections
        self.keep_bodies = keep_bodies
        self.result = LoadResult()
        self._loop = asyncio.get_running_loop()
        self._backlog: deque[tuple[float | None, bytes]] = deque()
        self._idle: list[_Connection] = []
        self._started: dict[_Connection, float] = {}
        self._changed = asyncio.Event()
        #: perf_counter time of the latest reply.
        self.last_reply_at = 0.0

    async def __aenter__(self) -> Pool:
        for _ in range(self.size):
            _, connection = await self._loop.create_connection(
                lambda: _Connection(self._on_reply), self.host, self.port
            )
            self._idle.append(connection)
        return self

    async def __aexit__(self, *_: object) -> None:
        for connection in [*self._idle, *self._started]:
            if connection.transport is not None:
                connection.transport.close()

    def submit(self, request: bytes, due: float | None = None) -> None:
        self.result.sent += 1
        while self._idle:
            connection = self._idle.pop()
            if not connection.lost:
                self._start(connection, due, request)
                return
        self._backlog.append((due, request))

    async def wait(self, timeout_s: float) -> None:
        """Until every submitted request has its reply, or timeout_s passes."""
        deadline = self._loop.time() + timeout_s
        while self.result.unfinished > 0 and (remaining := deadline - self._loop.time()) > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def _start(self, connection: _Connection, due: float | None, request: bytes) -> None:
        self._started[connection] = time.perf_counter() if due is None else due
        connection.send(request)

    def _on_reply(self, connection: _Connection, status: int, body: bytes) -> None:
        now = self.last_reply_at = time.perf_counter()
        began = self._started.pop(connection)
        self.result.replies.append(Reply(status, body if self.keep_bodies else b"", (now - began) * 1000))
        self.result.statuses[status] += 1
        if self._backlog:
            due, request = self._backlog.popleft()
            self._start(connection, due, request)
        else:
            self._idle.append(connection)
        self._changed.set()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic-GC pass in the middle of a run. A full pass in the benchmark's process took
    ~50 ms here: nothing is sent meanwhile, and every request due then counts the pause as the
    server's latency (wrk, written in C, has no such pause). Collected before, not during."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def open_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    rate: float,
    connections: int = 64,
    drain_s: float = 10.0,
) -> LoadResult:
    """Send `requests` at `rate` per second on a fixed schedule; see the module docstring."""
    with collector_paused():
        return await _open_loop(host, port, requests, rate, connections, drain_s)


async def _open_loop(
    host: str, port: int, requests: Sequence[bytes], rate: float, connections: int, drain_s: float
) -> LoadResult:
    async with Pool(host, port, connections) as pool:
        start = time.perf_counter() + 0.005
        index = 0
        while index < len(requests):
            now = time.perf_counter()
            while index < len(requests) and (due := start + index / rate) <= now:
                pool.submit(requests[index], due)
                index += 1
            if index < len(requests):
                # At least a tick: shorter sleeps return at once on uvloop (millisecond timers), and
                # that spin took the server's CPU. Sending up to 1 ms late only adds to the
                # measured latency (it counts from the due time), never hides it.
                await asyncio.sleep(max(SEND_TICK_S, start + index / rate - time.perf_counter()))
        await pool.wait(drain_s)
        pool.result.duration_s = max(pool.last_reply_at - start, len(requests) / rate)
        return pool.result


async def closed_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    connections: int,
    timeout_s: float = 300.0,
    keep_bodies: bool = False,
) -> LoadResult:
    """`connections` clients, each sending its next request when its last one returns."""
    with collector_paused():
        async with Pool(host, port, connections, keep_bodies) as pool:
            start = time.perf_counter()
            for request in requests:
                pool.submit(request)
            await pool.wait(timeout_s)
            pool.result.duration_s = pool.last_reply_at - start if pool.result.replies else 0.0
            return pool.result


class Session:
    """One keep-alive connection driven request by request: `await request(bytes)` returns the
    reply's status and body. For clients whose next request depends on the last reply (submit,
    then long-poll the id it returned)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._connection: _Connection | None = None
        self._reply: asyncio.Future[tuple[int, bytes]] | None = None

    async def __aenter__(self) -> Session:
        loop = asyncio.get_running_loop()
        _, self._connection = await loop.create_connection(
            lambda: _Connection(self._on_reply, self._on_lost), self.host, self.port
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()

    async def request(self, request: bytes) -> tuple[int, bytes]:
        assert self._connection is not None and self._reply is None, "one request at a time"
        self._reply = asyncio.get_running_loop().create_future()
        self._connection.send(request)
        try:
            return await self._reply
        finally:
            self._reply = None

    def _on_reply(self, _connection: _Connection, status: int, body: bytes) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_result((status, body))

    def _on_lost(self, exc: Exception | None) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ConnectionError(f"the server closed the connection ({exc!r})"))

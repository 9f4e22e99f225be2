"""The HTTP protocol `genq api` runs (api/edge/server.py): uvicorn's, with the writes of one event-loop
turn sent together. Real sockets throughout: responses must arrive whole and in order, on
keep-alive connections and on ones the server closes. (Streams, which write in many turns, run
through the same protocol in tests/api/routes/test_stream.py.)"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis
from starlette.background import BackgroundTask
from starlette.types import Message, Receive, Scope, Send

from api.edge.server import CLIENT_GONE, OneWriteTransport
from api.routes.stream import EventStream
from shared.config import Settings
from tests.api.live_server import live_server, serve
from tests.conftest import ApiProcess

pytestmark = pytest.mark.anyio


def read_response(stream: socket.socket, buffered: bytearray) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 response with a Content-Length: (status line, headers, body)."""
    while b"\r\n\r\n" not in buffered:
        chunk = stream.recv(65536)
        assert chunk, f"connection closed before a whole response: {bytes(buffered)!r}"
        buffered += chunk
    head, _, _ = bytes(buffered).partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}
    total = len(head) + 4 + int(headers[b"content-length"])
    while len(buffered) < total:
        chunk = stream.recv(65536)
        assert chunk, "connection closed in the middle of a body"
        buffered += chunk
    body = bytes(buffered[len(head) + 4 : total])
    del buffered[:total]
    return status, headers, body


def test_responses_arrive_whole_on_keep_alive_and_the_last_before_close(settings: Settings) -> None:
    with live_server(settings) as base_url:
        host, port = base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as stream:
            buffered = bytearray()
            for _ in range(3):
                stream.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                status, headers, body = read_response(stream, buffered)
                assert status == b"HTTP/1.1 200 OK"
                assert body == b'{"status":"ok"}'
            # Two requests in one packet: both answered, in order.
            one = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
            two = one + b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n"
            stream.sendall(two)
            assert read_response(stream, buffered)[0] == b"HTTP/1.1 200 OK"
            assert read_response(stream, buffered)[0] == b"HTTP/1.1 404 Not Found"
            # Connection: close -> the response is written, then the server closes.
            stream.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            status, headers, body = read_response(stream, buffered)
            assert (status, body) == (b"HTTP/1.1 200 OK", b'{"status":"ok"}')
            assert headers[b"connection"] == b"close"
            assert stream.recv(1) == b""  # closed after the whole response


async def test_writes_of_one_turn_and_of_later_turns_arrive_in_order_and_close_flushes() -> None:
    loop = asyncio.get_running_loop()
    received: asyncio.Queue[bytes | None] = asyncio.Queue()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.out = OneWriteTransport(transport, loop)  # type: ignore[arg-type]
            self.out.write(b"status ")
            self.out.writelines([b"headers ", b"body "])
            loop.call_later(0.01, self.later)

        def later(self) -> None:
            self.out.write(b"chunk ")
            self.out.write(b"last")
            self.out.close()  # in the same turn as the writes: they still go out first

    class Client(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            received.put_nowait(data)

        def connection_lost(self, exc: Exception | None) -> None:
            received.put_nowait(None)

    server = await loop.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(Client, "127.0.0.1", port)
    data = b""
    while (chunk := await asyncio.wait_for(received.get(), 5)) is not None:
        data += chunk
    assert data == b"status headers body chunk last"
    transport.close()
    server.close()
    await server.wait_closed()


def test_a_client_that_trickles_its_headers_is_cut_off(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_header_timeout_s=0.5)
    with live_server(settings) as base_url:
        host, port = base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as slow:
            started = time.monotonic()
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: local")  # and never the rest
            assert slow.recv(1) == b""  # the server closed it
            assert 0.4 < time.monotonic() - started < 3
        with socket.create_connection((host, int(port)), timeout=10) as idle:
            assert idle.recv(1) == b""  # connected and sent nothing: closed too
        # A client that sends its headers in time is served as ever.
        with socket.create_connection((host, int(port)), timeout=10) as prompt:
            prompt.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert read_response(prompt, bytearray())[0] == b"HTTP/1.1 200 OK"


def test_genq_api_runs_this_protocol(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_api: Callable[[Settings], ApiProcess],
) -> None:
    """`genq api` (the CLI process, not an app built in the test) serves through
    OneWriteHttpProtocol: its header timeout, which stock uvicorn lacks, cuts a trickling client off."""
    api = start_api(make_settings(api_header_timeout_s=0.5))
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: local")  # and never the rest
        assert slow.recv(1) == b""  # closed by the server
        assert 0.4 < time.monotonic() - started < 3


def test_a_stream_ends_when_its_client_leaves_without_anything_waiting_on_receive() -> None:
    """The CLIENT_GONE extension: an event stream (api/routes/stream.py EventStream) whose client
    closes the connection mid-stream is cancelled, its body's `finally` and its background task
    run, and `receive` was never called for it (Starlette's own way waits on `receive` in a task
    group of its own for every stream)."""
    ended = threading.Event()
    released = threading.Event()
    receive_calls: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"event: output\ndata: {}\n\n"
            await asyncio.Event().wait()  # a job that never ends
        finally:
            ended.set()

    async def release() -> None:
        released.set()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return

        async def counted() -> Message:
            receive_calls.append(scope["path"])
            return await receive()

        assert CLIENT_GONE in scope["extensions"]
        await EventStream(body(), media_type="text/event-stream", background=BackgroundTask(release))(
            scope, counted, send
        )

    with serve(app) as base_url, socket.create_connection(_address(base_url), timeout=10) as stream:
        stream.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        while b"data: {}" not in received:
            received += stream.recv(65536)
        assert received.startswith(b"HTTP/1.1 200 OK")
        stream.close()
        assert ended.wait(5) and released.wait(5)
    assert receive_calls == []


def _address(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)

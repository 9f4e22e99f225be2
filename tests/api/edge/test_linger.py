"""api/edge/asgi.py closing_unread under a real uvicorn, over a real socket: a request answered
before its body was read (a refused upload) has the rest of its body read and dropped within the
linger bounds before its connection closes, so a client that reads its answer only once it has
sent its body (httpx, so the OpenAI SDK) gets the answer, not a reset; past the bounds the server
stops reading and closes."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from api.edge.asgi import Linger
from api.edge.limits import BodySizeLimit
from tests.api.live_server import serve

#: The bounds of the server under test: far over the socket buffers, far under a hostile body.
LINGER = Linger(max_bytes=16 << 20, seconds=30.0)
#: A body a refused client sends whole: over the socket buffers, under LINGER's bytes.
BODY = 8 << 20
#: What a hostile client tries to send.
HOSTILE = 128 << 20
#: Bytes uvicorn may hand the app in one message past the bound (it reads up to 256 KiB a turn
#: and buffers up to 64 KiB before it pauses reading).
LAST_MESSAGE = 1 << 20
CHUNK = 1 << 16
ANSWER = json.dumps({"error": {"message": "missing API key", "code": "invalid_api_key"}}).encode()


class Refuses:
    """An upload route that answers 401 without reading its body."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})


class Counted:
    """The app under test, counting the body bytes the server hands it."""

    def __init__(self, linger: Linger) -> None:
        self.app = BodySizeLimit(Refuses(), max_bytes=1024, linger=linger, per_path={"/v1/files": 1 << 30})
        self.received = 0
        #: Set once the app has returned (the answer ended): the client may read its answer first.
        self.done = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_counted() -> Message:
            message = await receive()
            self.received += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, receive_counted, send)
        finally:
            self.done.set()

    def received_in_all(self) -> int:
        assert self.done.wait(10), "the request never ended"
        return self.received


@pytest.fixture
def server() -> Iterator[tuple[str, Counted]]:
    app = Counted(LINGER)
    with serve(app) as url:
        yield url, app


def chunks(size: int) -> Iterator[bytes]:
    for _ in range(size // CHUNK):
        yield b"u" * CHUNK


async def chunks_async(size: int) -> AsyncIterator[bytes]:
    for chunk in chunks(size):
        yield chunk


@pytest.mark.parametrize("client", ["sync", "async"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_httpx_client_refused_early_gets_its_answer(
    server: tuple[str, Counted], client: str, declared: bool
) -> None:
    url, app = server
    if client == "sync":
        answer = httpx.post(f"{url}/v1/files", content=b"u" * BODY if declared else chunks(BODY))
    else:

        async def post() -> httpx.Response:
            async with httpx.AsyncClient() as async_client:
                body = b"u" * BODY if declared else chunks_async(BODY)
                return await async_client.post(f"{url}/v1/files", content=body)

        answer = anyio.run(post)
    assert answer.status_code == 401 and answer.content == ANSWER
    assert answer.headers["connection"] == "close"
    assert app.received_in_all() == BODY  # read to its end, and dropped


def open_upload(url: str, size: int) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)  # a server that neither reads nor closes fails the test, not hangs it
    sock.sendall(b"POST /v1/files HTTP/1.1\r\nHost: genq\r\nContent-Length: %d\r\n\r\n" % size)
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while got := sock.recv(CHUNK):
        data += got
    return data


def test_a_body_within_the_bounds_is_read_to_its_end_and_the_connection_closes_cleanly(
    server: tuple[str, Counted],
) -> None:
    url, app = server
    with open_upload(url, BODY) as sock:
        for chunk in chunks(BODY):
            sock.sendall(chunk)  # no reset while sending: the server reads it all
        answer = read_to_eof(sock)  # then an end of stream, not a reset
    assert answer.startswith(b"HTTP/1.1 401 ") and answer.endswith(ANSWER)
    assert app.received_in_all() == BODY


def test_past_its_byte_bound_the_server_stops_reading_and_closes(server: tuple[str, Counted]) -> None:
    url, app = server
    sent = 0
    with open_upload(url, HOSTILE) as sock, pytest.raises(OSError):  # reset (or timed out: fails below)
        for chunk in chunks(HOSTILE):
            sock.sendall(chunk)
            sent += len(chunk)
    assert app.received_in_all() <= LINGER.max_bytes + LAST_MESSAGE
    assert sent < HOSTILE


def test_past_its_time_bound_the_server_stops_waiting_and_closes() -> None:
    """A client that stops sending midway holds its connection no longer than the bound."""
    app = Counted(Linger(max_bytes=LINGER.max_bytes, seconds=0.2))
    with serve(app) as url, open_upload(url, BODY) as sock:
        sock.sendall(b"u" * CHUNK)
        answer = read_to_eof(sock)  # the server closes; a socket timeout here fails the test
    assert answer.startswith(b"HTTP/1.1 401 ") and answer.endswith(ANSWER)
    assert app.received_in_all() == CHUNK

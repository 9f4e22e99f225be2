"""The HTTP protocol `genq api` runs (api/edge/uvicorn_adapter.py): uvicorn's, with a timeout on a
request's headers and each response sent in one write. Real sockets throughout: responses arrive
whole and in order, on keep-alive connections and on ones the server closes, a response's head
and body in one TCP segment; a client trickling its headers is cut off, one sending its body
slowly is not. The adapter's contract with the pinned uvicorn, and its public fallback,
are checked here too."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis
import uvicorn
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from api.edge.uvicorn_adapter import (
    PINNED_UVICORN,
    PUBLIC_HTTP,
    HeaderTimeoutProtocol,
    contract_holds,
    http_protocol,
)
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


#: Offset of tcpi_data_segs_in (segments that carried data) in Linux's struct tcp_info.
TCP_DATA_SEGS_IN = 152


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's TCP_INFO")
def test_a_response_head_and_body_leave_in_one_segment() -> None:
    """uvicorn writes a response's head and its body apart; through the adapter they leave in one
    write, so the client receives one TCP segment per response (two before, each a send() and a
    wake-up of the client)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await Response(b'{"ok":true}', media_type="application/json")(scope, receive, send)

    with serve(app) as base_url, socket.create_connection(_address(base_url), timeout=10) as conn:
        buffered = bytearray()
        for _ in range(3):
            conn.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert read_response(conn, buffered)[2] == b'{"ok":true}'
        info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        assert struct.unpack_from("I", info, TCP_DATA_SEGS_IN)[0] == 3


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
    HeaderTimeoutProtocol: its header timeout, which stock uvicorn lacks, cuts a trickling client off."""
    api = start_api(make_settings(api_header_timeout_s=0.5))
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: local")  # and never the rest
        assert slow.recv(1) == b""  # closed by the server
        assert 0.4 < time.monotonic() - started < 3


def test_a_stream_ends_when_its_client_leaves() -> None:
    """An event stream (StreamingResponse, as api/routes/stream.py sends one) whose client closes
    the connection mid-stream is cancelled: its body's `finally` and its background task (which
    gives the key's stream slot back) run."""
    ended = threading.Event()
    released = threading.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"event: output\ndata: {}\n\n"
            await asyncio.Event().wait()  # a job that never ends
        finally:
            ended.set()

    async def release() -> None:
        released.set()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            stream = StreamingResponse(
                body(), media_type="text/event-stream", background=BackgroundTask(release)
            )
            await stream(scope, receive, send)

    with serve(app) as base_url, socket.create_connection(_address(base_url), timeout=10) as stream:
        stream.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        while b"data: {}" not in received:
            received += stream.recv(65536)
        assert received.startswith(b"HTTP/1.1 200 OK")
        stream.close()
        assert ended.wait(5) and released.wait(5)


def test_a_slow_body_and_pipelined_requests_pass_the_header_watch(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter parses each request beside uvicorn only to time its headers: a body holding a
    blank line, sent slowly past the header timeout, and a request pipelined after it, are
    uvicorn's to serve as ever."""
    monkeypatch.setattr(HeaderTimeoutProtocol, "header_timeout_s", HeaderTimeoutProtocol.header_timeout_s)
    settings = make_settings(api_keys=["k"], api_header_timeout_s=0.3)  # no anonymous guard: any body
    with live_server(settings) as base_url, socket.create_connection(_address(base_url), timeout=10) as conn:
        body = b"text\r\n\r\nGET / HTTP/1.1\r\n\r\n"  # looks like a head; is a body
        head = b"POST /nope HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n"
        conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(0.6)  # the body is slow, not the headers
        conn.sendall(body[5:] + b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        buffered = bytearray()
        assert read_response(conn, buffered)[0] == b"HTTP/1.1 404 Not Found"
        assert read_response(conn, buffered)[0] == b"HTTP/1.1 200 OK"


def test_the_adapter_holds_on_the_pinned_uvicorn_and_gives_way_to_the_public_path_elsewhere(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The contract: on uvicorn 0.54.0 (pyproject.toml's pin) `genq api` runs the adapter; on any
    other version uvicorn's documented `http="httptools"`, with a warning saying the header
    timeout is off."""
    assert uvicorn.__version__ == PINNED_UVICORN
    assert contract_holds()
    assert http_protocol() == "api.edge.uvicorn_adapter:HeaderTimeoutProtocol"
    monkeypatch.setattr(uvicorn, "__version__", "0.55.0")
    with caplog.at_level(logging.WARNING, logger="genq.api"):
        assert http_protocol() == PUBLIC_HTTP
    assert [record.getMessage() for record in caplog.records] == ["header_timeout_off"]


def test_the_public_path_serves_as_ever(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.55.0")
    with live_server(settings) as base_url, socket.create_connection(_address(base_url), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert read_response(conn, bytearray())[0] == b"HTTP/1.1 200 OK"


def _address(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)

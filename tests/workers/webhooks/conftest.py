"""Fixtures of the webhook tests: keep-alive receivers that count their connections, and a server
that takes a client dropping its connection in silence."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from workers.webhooks import client

__all__ = ["CountingServer", "KeptAliveReceiver", "QuietServer", "serve", "servers"]


class KeptAliveReceiver(BaseHTTPRequestHandler):
    """Answers 200 over HTTP/1.1 keep-alive, as real receivers do."""

    protocol_version = "HTTP/1.1"
    hosts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        KeptAliveReceiver.hosts.append(str(self.headers["host"]))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_: object) -> None:
        return None


class QuietServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that takes a client dropping its connection in silence: tests drop
    them on purpose (a refused certificate, a connection the pool closes), and socketserver would
    print each one's traceback to the terminal."""

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class CountingServer(QuietServer):
    """Counts the TCP connections it accepts."""

    daemon_threads = True
    block_on_close = False
    accepted = 0

    def get_request(self) -> tuple[socket.socket, object]:
        request = super().get_request()
        self.accepted += 1
        return request


@pytest.fixture
def servers() -> Iterator[list[CountingServer]]:
    """Started CountingServers (serve() appends), shut down after the test, with every connection
    the attempts' pool kept."""
    KeptAliveReceiver.hosts = []
    started: list[CountingServer] = []
    yield started
    client._POOL.close()
    for server in started:
        server.shutdown()
        server.server_close()


def serve(servers: list[CountingServer], address: str = "127.0.0.1", port: int = 0) -> CountingServer:
    server = CountingServer((address, port), KeptAliveReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return server

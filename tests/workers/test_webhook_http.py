"""workers/webhook_http.py: one webhook attempt against real loopback receivers. The body and
headers arrive with the original Host, redirects are not followed, a receiver that does not answer
or drips its answer keeps nobody past the timeout, network trouble is a result, never an
exception, and https receivers are verified against the URL's host name although the connection
goes to the checked address. (The SSRF guard's address classes: tests/shared/test_ssrf.py.)"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import trustme

from cli.redis_server import free_port
from shared.ssrf import TargetPolicy
from workers import webhook_http
from workers.webhook_http import USER_AGENT, post

OPEN = TargetPolicy(allow_private=True, allowed_ports=frozenset())
GUARDED = TargetPolicy(allow_private=False, allowed_ports=frozenset(range(1, 65536)))


class Receiver(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        Receiver.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if self.path == "/redirect":
            self.send_response(307)
            self.send_header("location", "/elsewhere")
            self.end_headers()
            return
        if self.path == "/slow":
            time.sleep(2)
        self.send_response(410 if self.path == "/gone" else 204)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_body_and_headers_arrive_with_the_original_host(receiver: str) -> None:
    result = post(receiver + "/hook?t=1", b'{"a":1}', {"webhook-id": "msg_1"}, OPEN, timeout_s=5)
    assert (result.status_code, result.error, result.refused) == (204, None, False)
    assert result.duration_ms >= 0
    ((path, headers, body),) = Receiver.seen
    assert (path, body) == ("/hook?t=1", b'{"a":1}')
    # Connected to the checked address, but the receiver sees the name it was given.
    assert headers["host"] == receiver.removeprefix("http://")
    assert headers["webhook-id"] == "msg_1" and headers["user-agent"] == USER_AGENT
    assert headers["content-type"] == "application/json"


def test_statuses_are_reported_and_redirects_not_followed(receiver: str) -> None:
    assert post(receiver + "/gone", b"{}", {}, OPEN, timeout_s=5).status_code == 410
    assert post(receiver + "/redirect", b"{}", {}, OPEN, timeout_s=5).status_code == 307
    assert [path for path, _, _ in Receiver.seen] == ["/gone", "/redirect"]


def test_a_receiver_that_does_not_answer_in_time_is_a_timeout(receiver: str) -> None:
    result = post(receiver + "/slow", b"{}", {}, OPEN, timeout_s=0.5)
    assert result.status_code is None and result.error == "timeout: no answer within 0.5 s"
    assert not result.refused and result.duration_ms < 1900


def test_a_refused_target_is_never_contacted(receiver: str) -> None:
    result = post(receiver + "/hook", b"{}", {}, GUARDED, timeout_s=5)
    assert (
        result.refused and (result.error or "").startswith("refused: ") and "loopback" in (result.error or "")
    )
    assert Receiver.seen == []


def test_nobody_listening_is_a_connect_error_not_an_exception() -> None:
    result = post(f"http://127.0.0.1:{free_port()}/hook", b"{}", {}, OPEN, timeout_s=2)
    assert result.status_code is None and not result.refused
    assert (result.error or "").startswith("ConnectError")


def test_an_answer_that_drips_forever_is_cut_at_the_timeout() -> None:
    """The status line comes at once, then one byte a second: the status is all that matters."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def drip() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
        try:
            for _ in range(30):
                conn.sendall(b"x")
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    result = post(f"http://127.0.0.1:{port}/", b"{}", {}, OPEN, timeout_s=1.0)
    listener.close()
    assert result.status_code == 200 and time.monotonic() - started < 3


# --- https ---------------------------------------------------------------------------------------


@pytest.fixture
def trusted_ca() -> Iterator[trustme.CA]:
    """A throwaway CA that every attempt's TLS settings trust (beside certifi's roots), for this test
    only: the shared settings are built afresh before and after it."""
    webhook_http._tls_context.cache_clear()
    ca = trustme.CA()
    ca.configure_trust(webhook_http._tls_context())
    yield ca
    webhook_http._tls_context.cache_clear()


def _https_receiver(ca: trustme.CA, name: str) -> tuple[ThreadingHTTPServer, int]:
    """A receiver on 127.0.0.1 whose certificate `ca` issued for `name`."""
    Receiver.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(tls)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_an_https_receiver_is_verified_against_the_urls_host_name(trusted_ca: trustme.CA) -> None:
    """The connection goes to the checked address (127.0.0.1), the certificate is checked for the
    name in the URL (sent as SNI), and one TLS setup serves attempt after attempt."""
    server, port = _https_receiver(trusted_ca, "localhost")
    try:
        for _ in range(2):
            result = post(f"https://localhost:{port}/hook", b"{}", {}, OPEN, timeout_s=5)
            assert (result.status_code, result.error) == (204, None)
    finally:
        server.shutdown()
        server.server_close()
    assert [path for path, _, _ in Receiver.seen] == ["/hook", "/hook"]


@pytest.mark.parametrize("issuer", ["trusted CA, another name", "untrusted CA"])
def test_an_https_receiver_whose_certificate_does_not_hold_is_never_sent_the_body(
    trusted_ca: trustme.CA, issuer: str
) -> None:
    ca = trusted_ca if issuer.startswith("trusted") else trustme.CA()
    server, port = _https_receiver(ca, "elsewhere.example" if issuer.startswith("trusted") else "localhost")
    try:
        for _ in range(2):  # the shared TLS settings keep verifying
            result = post(f"https://localhost:{port}/hook", b"{}", {}, OPEN, timeout_s=5)
            assert result.status_code is None and not result.refused
            assert "CERTIFICATE_VERIFY_FAILED" in (result.error or "")
    finally:
        server.shutdown()
        server.server_close()
    assert Receiver.seen == []

"""workers/webhooks/client.py: one webhook attempt against real loopback receivers. The body and
headers arrive with the original Host, redirects are not followed, a receiver that does not answer
or drips its answer keeps nobody past the timeout, network trouble is a result, never an
exception, and https receivers are verified against the URL's host name although the connection
goes to the checked address. (The SSRF guard's address classes: tests/shared/test_ssrf.py.)"""

from __future__ import annotations

import re
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
from tests.conftest import ROOT
from tests.workers.webhooks.conftest import CountingServer, KeptAliveReceiver, QuietServer, serve
from workers.webhooks import client
from workers.webhooks.client import USER_AGENT, post
from workers.webhooks.connections import tls_context

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
    server = QuietServer(("127.0.0.1", 0), Receiver)
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


@pytest.mark.parametrize(
    ("url", "target", "host"),
    [
        ("http://receiver.example:{port}/hook", "/hook", "receiver.example:{port}"),
        ("http://receiver.example:{port}/a/b?x=1&y=%20z", "/a/b?x=1&y=%20z", "receiver.example:{port}"),
        ("http://receiver.example:{port}", "/", "receiver.example:{port}"),
        ("http://bücher.example:{port}/pfad/ä?q=é", "/pfad/%C3%A4?q=%C3%A9", "xn--bcher-kva.example:{port}"),
    ],
)
def test_the_receiver_gets_the_urls_target_and_host_as_they_travel(
    receiver: str, url: str, target: str, host: str
) -> None:
    """An attempt pinned to the checked address sends the URL's path and query, percent-encoded,
    and its host name (IDNA-encoded) with the port, whatever address it connected to."""
    port = receiver.rsplit(":", 1)[1]
    assert client._post_pinned(url.format(port=port), ["127.0.0.1"], b"{}", {}, 5) == 204
    ((path, headers, _),) = Receiver.seen
    assert (path, headers["host"]) == (target, host.format(port=port))
    assert headers["content-length"] == "2" and headers["accept-encoding"] == "identity"


@pytest.mark.parametrize(
    "headers",
    [
        {"webhook-id": "msg_1\r\nx-injected: 1"},
        {"webhook-id": "msg_1\nx-injected: 1"},
        {"webhook-id": "msg_1\x00"},
        {"webhook-id": "mßg"},
        {"webhook id": "msg_1"},
        {"": "msg_1"},
    ],
)
def test_a_header_that_could_add_a_line_is_refused_and_nothing_is_sent(
    receiver: str, headers: dict[str, str]
) -> None:
    with pytest.raises(ValueError, match="can not be sent"):
        post(receiver + "/hook", b"{}", headers, OPEN, timeout_s=5)
    assert Receiver.seen == []


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


def _post_to_a_scripted_receiver(
    parts: list[bytes], pause_s: float, timeout_s: float
) -> tuple[client.AttemptResult, float]:
    """An attempt to a receiver that reads the request, then sends `parts` one by one with
    `pause_s` after each; the attempt's result and how long it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        try:
            for part in parts:
                conn.sendall(part)
                time.sleep(pause_s)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    started = time.monotonic()
    result = post(f"http://127.0.0.1:{port}/", b"{}", {}, OPEN, timeout_s=timeout_s)
    listener.close()
    return result, time.monotonic() - started


def _dripping(head: bytes) -> tuple[client.AttemptResult, float]:
    """`head` at once, then one more byte every 0.2 s for 6 s, to an attempt with a 1 s timeout."""
    return _post_to_a_scripted_receiver([head, *[b"x"] * 30], pause_s=0.2, timeout_s=1.0)


def test_an_answer_that_drips_forever_is_cut_at_the_timeout() -> None:
    """The status line comes at once, then the body a byte at a time: the status is all that
    matters."""
    result, took_s = _dripping(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
    assert result.status_code == 200 and took_s < 3


def test_an_answer_with_an_endless_head_is_an_error_not_a_memory_sink() -> None:
    """Long header lines without end, as fast as the socket goes: the attempt ends once the answer
    passes ANSWER_CAP_BYTES (64 KiB), not at http.client's own bounds (100 lines of 64 KiB: here
    3.2 MB held before its error)."""
    lines = [b"x-%d: %s\r\n" % (index, b"y" * 32 * 1024) for index in range(200)]  # 6.4 MB
    result, took_s = _post_to_a_scripted_receiver([b"HTTP/1.1 200 OK\r\n", *lines], 0.0, timeout_s=5.0)
    assert result.status_code is None and (result.error or "").startswith("AnswerTooLarge: ")
    assert took_s < 3


def test_an_answer_whose_head_drips_is_a_timeout_at_the_attempts_timeout() -> None:
    """The status line, then the headers a byte every 0.2 s: each read is quick, the answer is
    not. Per-read timeouts alone would wait for the whole head (here 6 s)."""
    result, took_s = _dripping(b"HTTP/1.1 200 OK\r\n")
    assert result.status_code is None and result.error == "timeout: no answer within 1 s"
    assert took_s < 3


# --- https ---------------------------------------------------------------------------------------


@pytest.fixture
def trusted_ca() -> Iterator[trustme.CA]:
    """A throwaway CA that every attempt's TLS settings trust (beside certifi's roots), for this test
    only: the shared settings are built afresh before and after it."""
    tls_context.cache_clear()
    ca = trustme.CA()
    ca.configure_trust(tls_context())
    yield ca
    tls_context.cache_clear()


def _https_receiver(
    ca: trustme.CA, name: str, handler: type[BaseHTTPRequestHandler] = Receiver
) -> tuple[ThreadingHTTPServer, int]:
    """A receiver on 127.0.0.1 whose certificate `ca` issued for `name`."""
    Receiver.seen = []
    server = QuietServer(("127.0.0.1", 0), handler)
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


# --- kept-alive connections ------------------------------------------------------------------------


def _ok(url: str, addresses: list[str] | None = None) -> None:
    if addresses is None:
        result = post(url, b"{}", {}, OPEN, timeout_s=5)
        assert (result.status_code, result.error) == (200, None)
    else:  # as if the SSRF check had returned these addresses
        assert client._post_pinned(url, addresses, b"{}", {}, 5) == 200


def test_attempts_to_one_receiver_share_one_kept_alive_connection(servers: list[CountingServer]) -> None:
    server = serve(servers)
    for _ in range(3):
        _ok(f"http://127.0.0.1:{server.server_address[1]}/hook")
    assert server.accepted == 1 and len(KeptAliveReceiver.hosts) == 3


class _Answering(KeptAliveReceiver):
    """A keep-alive receiver whose answer the test picks: a body past the cap, a chunked body, or
    a `connection: close`."""

    answer = b""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        KeptAliveReceiver.hosts.append(str(self.headers["host"]))
        self.wfile.write(self.answer)


@pytest.mark.parametrize(
    ("answer", "connections"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10000\r\n\r\n" + b"x" * 10_000, 3),  # past the cap
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", 3),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 1),
    ],
    ids=["answer past the cap", "connection: close", "chunked answer read to its end"],
)
def test_a_connection_is_kept_only_when_its_answer_was_read_to_its_end_and_may_be_kept(
    servers: list[CountingServer], answer: bytes, connections: int
) -> None:
    """A capped answer leaves bytes on the connection (the next request would read them as its
    answer), and a receiver may ask to close: each attempt then gets a new connection, and none
    fails."""
    server = CountingServer(("127.0.0.1", 0), type("Handler", (_Answering,), {"answer": answer}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    for _ in range(3):
        _ok(f"http://127.0.0.1:{server.server_address[1]}/hook")
    assert server.accepted == connections and len(KeptAliveReceiver.hosts) == 3


def test_another_host_name_or_checked_address_never_takes_the_connection(
    servers: list[CountingServer],
) -> None:
    """The same address under two names, and the same name checked to two addresses: each its own
    connection (the second server listens on 127.0.0.2, same port)."""
    first = serve(servers)
    port = first.server_address[1]
    second = serve(servers, "127.0.0.2", port)
    _ok(f"http://127.0.0.1:{port}/hook")
    _ok(f"http://localhost:{port}/hook", ["127.0.0.1"])
    _ok(f"http://localhost:{port}/hook", ["127.0.0.2"])
    _ok(f"http://localhost:{port}/hook", ["127.0.0.1"])  # the kept one of this name and address
    assert (first.accepted, second.accepted) == (2, 1)
    assert KeptAliveReceiver.hosts == [f"127.0.0.1:{port}"] + [f"localhost:{port}"] * 3


def test_a_connection_the_receiver_closed_while_idle_is_not_a_failed_attempt(
    servers: list[CountingServer],
) -> None:
    server = serve(servers)
    KeptAliveReceiver.timeout = 0.2  # the receiver's idle timeout: it closes the connection
    try:
        _ok(f"http://127.0.0.1:{server.server_address[1]}/hook")
        time.sleep(0.6)
        _ok(f"http://127.0.0.1:{server.server_address[1]}/hook")
    finally:
        KeptAliveReceiver.timeout = None
    assert server.accepted == 2 and len(KeptAliveReceiver.hosts) == 2


def test_a_connection_closed_as_the_request_goes_out_gets_it_again_on_a_new_one() -> None:
    """The race a receiver's idle timeout makes: the kept connection was open when taken, and the
    receiver closes it on reading the next request, before any answer. The attempt is made once
    more on a new connection: one delivery, no failed attempt."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    requests: list[int] = []  # per connection, the requests it was sent

    def serve() -> None:
        kept, _ = listener.accept()
        kept.recv(65536)
        requests.append(1)
        kept.sendall(answer)
        kept.recv(65536)  # the next request arrives: closed unanswered
        requests.append(2)
        kept.close()
        fresh, _ = listener.accept()
        fresh.recv(65536)
        requests.append(1)
        fresh.sendall(answer)
        fresh.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        for _ in range(2):
            result = post(f"http://127.0.0.1:{port}/", b"{}", {}, OPEN, timeout_s=5)
            assert (result.status_code, result.error) == (200, None)
        thread.join(5)
        assert requests == [1, 2, 1]
    finally:
        listener.close()
        client._POOL.close()


def test_threads_never_share_a_connection(servers: list[CountingServer]) -> None:
    """8 threads, 5 attempts each, at once: every one answered, on at most 8 connections."""
    server = serve(servers)
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"

    def attempts() -> None:
        for _ in range(5):
            _ok(url)

    threads = [threading.Thread(target=attempts) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(KeptAliveReceiver.hosts) == 40 and 1 <= server.accepted <= 8


def test_an_https_connection_kept_for_one_name_never_serves_another(trusted_ca: trustme.CA) -> None:
    """Two attempts to https://localhost share one verified connection; an attempt to the same
    address by a name the certificate does not hold gets its own, and fails verification."""
    KeptAliveReceiver.hosts = []
    server, port = _https_receiver(trusted_ca, "localhost", KeptAliveReceiver)
    accepted = _count_accepts(server)
    try:
        for _ in range(2):
            result = post(f"https://localhost:{port}/hook", b"{}", {}, OPEN, timeout_s=5)
            assert (result.status_code, result.error) == (200, None)
        other = post(f"https://127.0.0.1:{port}/hook", b"{}", {}, OPEN, timeout_s=5)
        assert other.status_code is None and "CERTIFICATE_VERIFY_FAILED" in (other.error or "")
    finally:
        client._POOL.close()
        server.shutdown()
        server.server_close()
    assert KeptAliveReceiver.hosts == [f"localhost:{port}"] * 2 and len(accepted) == 1


def _count_accepts(server: ThreadingHTTPServer) -> list[object]:
    """The connections `server` accepts from now on (TLS handshakes included)."""
    accepted: list[object] = []
    accept = server.get_request

    def counted() -> tuple[socket.socket, object]:
        request = accept()
        accepted.append(request[1])
        return request

    server.get_request = counted  # type: ignore[method-assign]
    return accepted


#: What reaching into http.client's insides looks like, in a module that uses it: its private
#: names, a copy of its code, or a swapped helper (the webhook client once ran a copy of
#: HTTPResponse.begin with parse_headers swapped). The client uses its public API alone.
PRIVATE_REACH = re.compile(
    r"http\.client\._\w+|from http\.client import [^\n]*\b_\w+|__code__|parse_headers"
    r"|\._(?:method|safe_read|read_status|check_close|close_conn|send_output|output|buffer|tunnel)\b"
)


def test_the_workers_use_only_http_clients_public_api() -> None:
    users = [path for path in sorted((ROOT / "workers").rglob("*.py")) if "http.client" in path.read_text()]
    reaches = {str(path.relative_to(ROOT)): PRIVATE_REACH.findall(path.read_text()) for path in users}
    assert {path: found for path, found in reaches.items() if found} == {}
    assert users, "no module of workers/ uses http.client: this test checks nothing"

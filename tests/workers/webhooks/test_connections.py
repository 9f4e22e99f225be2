"""workers/webhooks/connections.py: the pool of kept-alive webhook connections, against a real
loopback receiver that counts its connections. Idle connections are bounded in number (the oldest
closed first) and in age, one the receiver closed is not handed out, and one whose exchange did
not end cleanly is closed, not kept; an answer is read by http.client's own rules, and kept only
when they keep the connection. (Reuse through whole attempts, names, addresses, TLS, answers not
read to their end, dripping and endless answers: tests/workers/webhooks/test_client.py.)"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time

import pytest

from tests.workers.webhooks.conftest import CountingServer, KeptAliveReceiver, serve
from workers.webhooks.connections import Connection, Pool, Route, tls_context


def _routes(port: int) -> list[Route]:
    return [Route("http", name, port, "127.0.0.1") for name in ("127.0.0.1", "localhost")]


def test_idle_connections_are_bounded_in_number_and_age(servers: list[CountingServer]) -> None:
    server = serve(servers)
    port = server.server_address[1]
    pool = Pool(max_idle=1, idle_s=0.3)
    tls = tls_context()
    routes = _routes(port)
    taken = [pool.take(route, tls) for route in routes]
    for connection in taken:
        _use(pool, connection)
    assert pool.idle_count() == 1 and taken[0].closed  # the oldest went
    assert pool.take(routes[1], tls) is taken[1]
    _use(pool, taken[1])
    time.sleep(0.5)
    fresh = pool.take(routes[1], tls)
    assert not fresh.reused and taken[1].closed  # too old: closed, not reused
    _use(pool, fresh)
    assert server.accepted == 3
    pool.close()


def _post(connection: Connection) -> http.client.HTTPResponse:
    connection.set_timeout(5)
    return connection.exchange("/", {"host": connection.route.host}, b"{}", 5)


def _use(pool: Pool, connection: Connection) -> None:
    """One POST on `connection`, its answer read to its end (as an attempt marks it: reusable),
    and the connection given back to `pool`."""
    response = _post(connection)
    response.read()
    connection.reusable = True
    pool.give_back(connection)


def test_a_connection_the_receiver_closed_is_not_handed_out(servers: list[CountingServer]) -> None:
    server = serve(servers)
    pool, tls = Pool(), tls_context()
    route = _routes(server.server_address[1])[0]
    KeptAliveReceiver.timeout = 0.2  # the receiver's idle timeout: it closes the connection
    try:
        first = pool.take(route, tls)
        _use(pool, first)
        time.sleep(0.6)
        second = pool.take(route, tls)
    finally:
        KeptAliveReceiver.timeout = None
    assert second is not first and not second.reused and first.closed
    pool.close()


def test_a_connection_whose_answer_was_not_read_to_its_end_is_closed_not_kept(
    servers: list[CountingServer],
) -> None:
    """A capped or abandoned answer leaves bytes on the connection: the next request would read
    them as its answer."""
    server = serve(servers)
    pool, tls = Pool(), tls_context()
    route = _routes(server.server_address[1])[0]
    connection = pool.take(route, tls)
    _post(connection)  # the answer's body is never read: the attempt never marks it reusable
    pool.give_back(connection)
    assert pool.idle_count() == 0 and connection.closed


def _answered_once(raw: bytes) -> tuple[int, bytes, bool]:
    """The status and body of an exchange with a receiver that answers `raw` and then waits (or,
    for an answer framed by its end, closes), and whether the connection may carry another
    request."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(raw)
        if b"\r\n\r\nuntil the end" in raw:
            conn.close()
        else:
            time.sleep(1)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    connection = Connection(Route("http", "127.0.0.1", listener.getsockname()[1], "127.0.0.1"), tls_context())
    try:
        response = _post(connection)
        body = response.read()
        return response.status, body, not connection.closed
    finally:
        connection.close()
        listener.close()


#: Answers of every framing, with the status, body and keep-alive verdict http.client reads in them.
ANSWERS = {
    "length": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A:  spaced \r\n\r\nok", 200, b"ok", True),
    "chunked": (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        201,
        b"ok",
        True,
    ),
    "close": (b"HTTP/1.1 500 Oops\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 500, b"", False),
    "no length": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
        200,
        b"until the end",
        False,
    ),
    "http/1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 200, b"x", False),
    "http/1.0 keep-alive": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
        200,
        b"",
        True,
    ),
    "no content": (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True),
    "100 continue": (
        b"HTTP/1.1 100 Continue\r\nX: 1\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
        202,
        b"",
        True,
    ),
    "folded": (b"HTTP/1.1 200 OK\r\nX-Long: one\r\n  two\r\nContent-Length: 0\r\n\r\n", 200, b"", True),
    "LF only": (b"HTTP/1.1 200 OK\nContent-Length: 1\n\nz", 200, b"z", True),
}


@pytest.mark.parametrize(("raw", "status", "body", "kept"), ANSWERS.values(), ids=ANSWERS.keys())
def test_an_answer_is_read_by_http_clients_rules_and_the_connection_kept_by_them(
    raw: bytes, status: int, body: bytes, kept: bool
) -> None:
    assert _answered_once(raw) == (status, body, kept)


def test_a_tls_context_whose_sockets_are_not_bounded_is_refused() -> None:
    """Without tls_context()'s sockets an answer's reads would have no deadline: a connection with
    such a context is refused before it connects."""
    route = Route("https", "localhost", 443, "127.0.0.1")
    with pytest.raises(TypeError, match="BoundedTLSSocket"):
        Connection(route, ssl.create_default_context())

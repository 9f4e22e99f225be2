"""workers/webhooks/connections.py: the pool of kept-alive webhook connections, against a real
loopback receiver that counts its connections. Idle connections are bounded in number (the oldest
closed first) and in age, one the receiver closed is not handed out, and one whose exchange did
not end cleanly is closed, not kept. (Reuse through whole attempts, names, addresses, TLS, and
answers not read to their end: tests/workers/webhooks/test_client.py.)"""

from __future__ import annotations

import http.client
import io
import time

import pytest

from tests.workers.webhooks.conftest import CountingServer, KeptAliveReceiver, serve
from workers.webhooks import client
from workers.webhooks.connections import HEAD_LINE_BYTES, HEAD_LINES, Connection, Pool, Route, _Answer


def _routes(port: int) -> list[Route]:
    return [Route("http", name, port, "127.0.0.1") for name in ("127.0.0.1", "localhost")]


def test_idle_connections_are_bounded_in_number_and_age(servers: list[CountingServer]) -> None:
    server = serve(servers)
    port = server.server_address[1]
    pool = Pool(max_idle=1, idle_s=0.3)
    tls = client._tls_context()
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
    head = f"POST / HTTP/1.1\r\nhost: {connection.route.host}\r\ncontent-length: 2\r\n\r\n"
    return connection.exchange(head.encode() + b"{}", 5)


def _use(pool: Pool, connection: Connection) -> None:
    """One POST on `connection`, its answer read to its end (as an attempt marks it: reusable),
    and the connection given back to `pool`."""
    response = _post(connection)
    response.read()
    connection.reusable = not response.will_close
    pool.give_back(connection)


def test_a_connection_the_receiver_closed_is_not_handed_out(servers: list[CountingServer]) -> None:
    server = serve(servers)
    pool, tls = Pool(), client._tls_context()
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
    pool, tls = Pool(), client._tls_context()
    route = _routes(server.server_address[1])[0]
    connection = pool.take(route, tls)
    _post(connection)  # the answer's body is never read: the attempt never marks it reusable
    pool.give_back(connection)
    assert pool.idle_count() == 0 and connection.closed


class _Bytes:
    """What HTTPResponse reads an answer through: a socket's makefile, here over fixed bytes."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._raw))


ANSWERS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A:  spaced \r\n\r\nok",
    "chunked": b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "close": b"HTTP/1.1 500 Oops\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    "no length": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
    "http/1.0": b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "http/1.0 keep-alive": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n"
    ),
    "no content": b"HTTP/1.1 204 No Content\r\n\r\n",
    "100 continue": (
        b"HTTP/1.1 100 Continue\r\nX: 1\r\n\r\nHTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"
    ),
    "folded": b"HTTP/1.1 200 OK\r\nX-Long: one\r\n  two\r\nContent-Length: 0\r\n\r\n",
    "repeated": b"HTTP/1.1 200 OK\r\nSet-Cookie: a\r\nSet-Cookie: b\r\nContent-Length: 0\r\n\r\n",
    "negative length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    "LF only": b"HTTP/1.1 200 OK\nContent-Length: 1\n\nz",
}


@pytest.mark.parametrize("raw", ANSWERS.values(), ids=ANSWERS.keys())
def test_an_answer_is_read_as_http_client_reads_it(raw: bytes) -> None:
    """_Answer reads its head with read_head, not email's parser: the same status, framing,
    keep-alive verdict, headers and body as http.client's own HTTPResponse."""
    ours, stock = _Answer(_Bytes(raw)), http.client.HTTPResponse(_Bytes(raw))  # type: ignore[arg-type]
    ours.begin()
    stock.begin()
    framing = ("status", "reason", "version", "chunked", "length", "will_close")
    assert [getattr(ours, name) for name in framing] == [getattr(stock, name) for name in framing]
    assert ours.getheaders() == stock.getheaders()
    assert ours.read() == stock.read()


def test_a_head_line_that_is_no_header_ends_reuse_of_the_connection() -> None:
    # email's parser ends the head at such a line; read_head reads on but marks the answer closing.
    raw = b"HTTP/1.1 200 OK\r\nnot a header\r\nContent-Length: 0\r\n\r\n"
    answer = _Answer(_Bytes(raw))  # type: ignore[arg-type]
    answer.begin()
    assert answer.status == 200 and answer.will_close


def test_a_head_of_too_many_or_too_long_lines_is_refused() -> None:
    for lines in (HEAD_LINES - 1, HEAD_LINES):  # the most http.client reads, and one more
        many = b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * lines + b"\r\n"
        answers = [_Answer(_Bytes(many)), http.client.HTTPResponse(_Bytes(many))]  # type: ignore[arg-type]
        for answer in answers:
            if lines < HEAD_LINES:
                answer.begin()
                continue
            with pytest.raises(http.client.HTTPException, match="more than"):
                answer.begin()
    long = b"HTTP/1.1 200 OK\r\nX: " + b"a" * HEAD_LINE_BYTES + b"\r\n\r\n"
    with pytest.raises(http.client.LineTooLong):
        _Answer(_Bytes(long)).begin()  # type: ignore[arg-type]

"""workers/webhook_connections.py: the pool of kept-alive webhook connections, against a real
loopback receiver that counts its connections. Idle connections are bounded in number (the oldest
closed first) and in age, one the receiver closed is not handed out, and one whose exchange did
not end cleanly is closed, not kept. (Reuse through whole attempts, names, addresses, TLS, and
answers not read to their end: tests/workers/test_webhook_http.py.)"""

from __future__ import annotations

import http.client
import time

from tests.workers.conftest import CountingServer, KeptAliveReceiver, serve
from workers import webhook_http
from workers.webhook_connections import Connection, Pool, Route


def _routes(port: int) -> list[Route]:
    return [Route("http", name, port, "127.0.0.1") for name in ("127.0.0.1", "localhost")]


def test_idle_connections_are_bounded_in_number_and_age(servers: list[CountingServer]) -> None:
    server = serve(servers)
    port = server.server_address[1]
    pool = Pool(max_idle=1, idle_s=0.3)
    tls = webhook_http._tls_context()
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
    connection.http.request("POST", "/", body=b"{}", headers={"host": connection.route.host})
    return connection.http.getresponse()


def _use(pool: Pool, connection: Connection) -> None:
    """One POST on `connection`, its answer read to its end (as an attempt marks it: reusable),
    and the connection given back to `pool`."""
    response = _post(connection)
    response.read()
    connection.reusable = not response.will_close
    pool.give_back(connection)


def test_a_connection_the_receiver_closed_is_not_handed_out(servers: list[CountingServer]) -> None:
    server = serve(servers)
    pool, tls = Pool(), webhook_http._tls_context()
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
    pool, tls = Pool(), webhook_http._tls_context()
    route = _routes(server.server_address[1])[0]
    connection = pool.take(route, tls)
    _post(connection)  # the answer's body is never read: the attempt never marks it reusable
    pool.give_back(connection)
    assert pool.idle_count() == 0 and connection.closed

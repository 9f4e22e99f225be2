"""Keep-alive connections for webhook attempts, each reused only for what it was checked for.

An attempt connects to an address the SSRF guard checked for it (workers/webhook_http.py), so
the origin it connects to is that address, not the URL's host name. httpx's pool (httpcore's
ConnectionPool) keys a connection by that origin alone: two host names on one address would share
a connection, and an https connection verified for one name would carry requests for the other.
So this is a small pool of our own over httpcore's single connections, keyed by a Route:
(scheme, the URL's host name, port, the checked address), and the TLS settings it was opened with.
A connection is taken only by an attempt whose own SSRF check (run for every attempt) allowed its
address, for the same host name, so its certificate was verified against that name when it was
opened, exactly as a new one's would be. Going to httpcore directly also skips what httpx adds per
request that a webhook never uses (cookies, redirects machinery, URL re-parsing): together with the
reuse, most of an attempt's CPU.

Threads: a taken connection is out of the pool until its thread gives it back, so two threads
never share one. Only a connection whose answer was read to its end comes back (httpcore marks it
idle then; a capped, timed-out or failed one is closed). Idle connections are bounded in number
(MAX_IDLE, the oldest closed first) and in age (IDLE_S): older ones are closed, never reused.

A receiver may close an idle connection whenever it likes. One found closed when taken is dropped
(httpcore's has_expired: an idle socket that is readable has been closed). One the receiver closes
while the request goes out fails before any byte of an answer; `received` lets the attempt see
that and make it once more on a new connection (workers/webhook_http.py).
"""

from __future__ import annotations

import ssl
import threading
import time
import typing
from dataclasses import dataclass

import httpcore

#: Most idle connections kept, all routes together (a webhook worker runs up to its task threads'
#: attempts at once; each may leave one).
MAX_IDLE = 64
#: An idle connection older than this is closed, not reused: below the 5 s idle timeout of Node's
#: HTTP server (the shortest common default), so we usually close before a receiver does.
IDLE_S = 4.0


@dataclass(frozen=True, slots=True)
class Route:
    """Everything an attempt checked before connecting: a connection serves only its own Route."""

    scheme: str
    #: The URL's host name: the Host header's, the TLS SNI name, what the certificate must match.
    host: str
    port: int
    #: The address the SSRF check allowed, which the connection goes to.
    address: str


class _CountingStream(httpcore.NetworkStream):
    """A network stream that counts the bytes of answer read from it (TLS handshakes excluded)."""

    def __init__(self, inner: httpcore.NetworkStream, counter: list[int]) -> None:
        self._inner = inner
        self._counter = counter

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, timeout)
        self._counter[0] += len(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _CountingStream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._counter)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _CountingBackend(httpcore.SyncBackend):
    def __init__(self, counter: list[int]) -> None:
        self._counter = counter

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = super().connect_tcp(host, port, timeout, local_address, socket_options)
        return _CountingStream(stream, self._counter)


class Connection:
    """One connection to one Route (opened at its first request)."""

    def __init__(self, route: Route, tls: ssl.SSLContext) -> None:
        self.route = route
        self.tls = tls
        #: Whether an earlier attempt used it (the receiver may have closed it since).
        self.reused = False
        self._received = [0]
        origin = httpcore.Origin(route.scheme.encode("ascii"), route.address.encode("ascii"), route.port)
        self.http = httpcore.HTTPConnection(
            origin, ssl_context=tls, keepalive_expiry=IDLE_S, network_backend=_CountingBackend(self._received)
        )
        self.idle_since = 0.0

    @property
    def received(self) -> int:
        """Bytes of answers read on it so far."""
        return self._received[0]

    def close(self) -> None:
        self.http.close()


class Pool:
    """Idle connections by Route; see the module docstring."""

    def __init__(self, max_idle: int = MAX_IDLE, idle_s: float = IDLE_S) -> None:
        self._max_idle = max_idle
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[Connection] = []  # oldest first

    def take(self, route: Route, tls: ssl.SSLContext) -> Connection:
        """An idle connection to `route` opened with `tls`, or a new one; the caller's alone."""
        while (found := self._pop(route, tls)) is not None:
            if not found.http.has_expired():  # the receiver has not closed it
                found.reused = True
                return found
            found.close()
        return Connection(route, tls)

    def give_back(self, connection: Connection) -> None:
        """Keep `connection` for the next attempt if its exchange ended cleanly; else close it."""
        # A connection that failed to connect reads as idle to httpcore, and as closed.
        if not connection.http.is_idle() or connection.http.is_closed():
            connection.close()
            return
        connection.idle_since = time.monotonic()
        with self._lock:
            self._idle.append(connection)
            surplus = self._expire()
            overflow = max(0, len(self._idle) - self._max_idle)  # the oldest go first
            surplus += self._idle[:overflow]
            del self._idle[:overflow]
        for old in surplus:
            old.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def idle_count(self) -> int:
        return len(self._idle)

    def _pop(self, route: Route, tls: ssl.SSLContext) -> Connection | None:
        with self._lock:
            expired = self._expire()
            found = None
            for index in range(len(self._idle) - 1, -1, -1):  # the newest: the likeliest still open
                candidate = self._idle[index]
                if candidate.route == route and candidate.tls is tls:
                    found = self._idle.pop(index)
                    break
        for old in expired:
            old.close()
        return found

    def _expire(self) -> list[Connection]:
        """Take out (under the lock) the connections idle longer than idle_s; the caller closes them."""
        cutoff = time.monotonic() - self._idle_s
        stale = 0
        while stale < len(self._idle) and self._idle[stale].idle_since < cutoff:
            stale += 1
        expired = self._idle[:stale]
        del self._idle[:stale]
        return expired

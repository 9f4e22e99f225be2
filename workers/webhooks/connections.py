"""Keep-alive connections for webhook attempts, each reused only for what it was checked for.

An attempt connects to the address the SSRF guard checked for it (workers/webhooks/client.py),
not to the URL's host name. A pool keyed by that address alone (httpx's, httpcore's, urllib3's
per-host pools) would let two host names on one address share a connection, and an https
connection verified for one name carry requests for the other. So this small pool is keyed by a
Route (scheme, host name, port, checked address) and the TLS settings it was opened with: a reused
connection was verified against the same name, exactly as a new one would be.

A connection is the standard library's `http.client.HTTPConnection`, used through its public API:
`connect` (overridden, as HTTPSConnection does, to open a socket to the checked address and, for
https, verify TLS for the host name), `request` (head and body in one write) and `getresponse`.
An answer is read through the connection's own socket (BoundedSocket; for TLS, BoundedTLSSocket,
which tls_context() installs as its SSLContext's documented `sslsocket_class`), whose reads each
get only the time left before the attempt's deadline and stop at ANSWER_CAP_BYTES: per-read
timeouts alone would let a receiver dripping a byte per timeout hold an attempt for hours, and
http.client alone reads up to 100 header lines of 64 KiB.

A taken connection is out of the pool until its thread gives it back, so threads never share
one; only a connection whose answer was read to its end, and not asked to close, comes back.
Idle connections are bounded in number (MAX_IDLE) and age (IDLE_S). One the receiver closed is
dropped when taken, or, closed while the request goes out, lets the attempt retry once on a new
connection (`answered`)."""

from __future__ import annotations

import contextlib
import functools
import http.client
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

#: Most idle connections kept, all routes together (a webhook worker runs up to its task threads'
#: attempts at once; each may leave one).
MAX_IDLE = 64
#: An idle connection older than this is closed, not reused: below the 5 s idle timeout of Node's
#: HTTP server (the shortest common default), so we usually close before a receiver does.
IDLE_S = 4.0
#: Most bytes of one answer read from its connection, head and body together: a head larger than
#: this is an error (h11, used before, allowed 16 KiB), and the body is capped far below it
#: (client.RESPONSE_CAP_BYTES).
ANSWER_CAP_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Route:
    """Everything an attempt checked before connecting: a connection serves only its own Route."""

    scheme: str
    #: The URL's host name: the Host header's, the TLS SNI name, what the certificate must match.
    host: str
    port: int
    #: The address the SSRF check allowed, which the connection goes to.
    address: str


class ConnectError(OSError):
    """The connection could not be made: refused, unreachable, or its TLS handshake failed
    (a certificate that does not hold for the host name among them). Nothing was sent."""


class AnswerTooLarge(OSError):
    """An answer went on past ANSWER_CAP_BYTES (its head alone, when its status had not come)."""


class _Bounds:
    """Where the answer being read on a socket must end: by `deadline` (time.monotonic), within
    ANSWER_CAP_BYTES."""

    __slots__ = ("deadline", "left_bytes")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.left_bytes = ANSWER_CAP_BYTES

    def read(
        self,
        sock: socket.socket,
        recv_into: Callable[[WriteableBuffer, int, int], int],
        buffer: WriteableBuffer,
        nbytes: int | None,
        flags: int,
    ) -> int:
        """One read of the answer on `sock` through `recv_into` (the socket class's own), given the
        time left as its timeout and no more bytes than are left."""
        left_s = self.deadline - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("the answer did not come within the attempt's timeout")
        if self.left_bytes <= 0:
            raise AnswerTooLarge(f"the answer went on past {ANSWER_CAP_BYTES} bytes")
        sock.settimeout(left_s)
        read = recv_into(buffer, min(nbytes or memoryview(buffer).nbytes, self.left_bytes), flags)
        self.left_bytes -= read
        return read


class BoundedSocket(socket.socket):
    """A TCP socket whose reads keep to its `bounds` while an answer is read (http.client reads an
    answer through the socket's makefile, which reads with recv_into)."""

    bounds: _Bounds | None = None

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        if self.bounds is None:
            return super().recv_into(buffer, nbytes, flags)
        return self.bounds.read(self, super().recv_into, buffer, nbytes, flags)


class BoundedTLSSocket(ssl.SSLSocket):
    """BoundedSocket's TLS twin: what tls_context() wraps sockets in."""

    bounds: _Bounds | None = None

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        if self.bounds is None:
            return super().recv_into(buffer, nbytes, flags)
        return self.bounds.read(self, super().recv_into, buffer, nbytes, flags)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """What httpx builds for a client by default (certifi's roots, certificates and host names
    verified), its sockets BoundedTLSSockets, built once rather than per connection: loading the CA
    bundle is slow enough to bound a webhook worker's delivery rate. An SSLContext may serve
    threads at once."""
    context = httpx.create_ssl_context(trust_env=False)
    context.sslsocket_class = BoundedTLSSocket
    return context


class _Pinned(http.client.HTTPConnection):
    """An HTTPConnection to the Route's checked address: its socket a BoundedSocket, or for https a
    BoundedTLSSocket verified for the Route's host name."""

    def __init__(self, route: Route, tls: ssl.SSLContext | None) -> None:
        if tls is not None and not issubclass(tls.sslsocket_class, BoundedTLSSocket):
            raise TypeError("webhook TLS connections need tls_context()'s sockets (BoundedTLSSocket)")
        super().__init__(route.address, route.port, timeout=None)  # Connection.set_timeout sets it
        self._route = route
        self._tls = tls

    def connect(self) -> None:
        route = self._route
        sock: socket.socket = BoundedSocket(socket.AF_INET6 if ":" in route.address else socket.AF_INET)
        try:
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect((route.address, route.port))
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=route.host)
        except TimeoutError:
            sock.close()
            raise
        except OSError as exc:  # ssl.SSLError is one
            sock.close()
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        self.sock = sock


#: Linux's TCP_CORK (None elsewhere): a socket's writes held back, then sent together.
_CORK: int | None = getattr(socket, "TCP_CORK", None)


@contextlib.contextmanager
def _corked(sock: socket.socket) -> Iterator[None]:
    """The block's writes on `sock` sent together when it ends (with _CORK; elsewhere each write
    goes as it comes)."""
    if _CORK is None:
        yield
        return
    sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # the request failed, the socket with it
            sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)


class Connection:
    """One connection to one Route (opened at its first request)."""

    def __init__(self, route: Route, tls: ssl.SSLContext) -> None:
        self.route = route
        self.tls = tls
        #: Whether an earlier attempt used it (the receiver may have closed it since).
        self.reused = False
        #: Whether its last exchange read an answer to the end and may carry the next request.
        self.reusable = False
        #: Answers whose status line was read on it so far.
        self.answered = 0
        self.idle_since = 0.0
        self.http = _Pinned(route, tls if route.scheme == "https" else None)

    @property
    def closed(self) -> bool:
        """Whether it holds no open socket (never opened, closed, or handed to an answer that
        ends it: http.client lets go of a connection whose answer will close it)."""
        return self.http.sock is None

    def set_timeout(self, timeout_s: float) -> None:
        """Every network wait from now on (connect, each send) is cut at timeout_s; the answer is
        read by exchange()'s deadline."""
        self.http.timeout = timeout_s
        if self.http.sock is not None:
            self.http.sock.settimeout(timeout_s)

    def exchange(
        self, target: str, headers: Mapping[str, str], body: bytes, answer_within_s: float
    ) -> http.client.HTTPResponse:
        """POST `body` to `target` with `headers` (connecting first when it is not open; the head
        and the body leave in one packet) and read its answer's head; the whole answer (status
        line, headers and body) is read within `answer_within_s` of the request going out, or its
        reads raise TimeoutError, and past ANSWER_CAP_BYTES they raise AnswerTooLarge."""
        if self.http.sock is None:
            self.http.connect()
        sock = self.http.sock
        assert isinstance(sock, BoundedSocket | BoundedTLSSocket), "connect() opened it"
        with _corked(sock):  # http.client writes the head, then the body: one packet, not two
            self.http.request("POST", target, body, dict(headers))
        sock.bounds = _Bounds(time.monotonic() + answer_within_s)
        answer = self.http.getresponse()
        self.answered += 1
        return answer

    def has_expired(self) -> bool:
        """Whether the receiver closed it (or sent what no request asked for) while it was idle."""
        sock = self.http.sock
        if sock is None:
            return True
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        self.reusable = False
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
            if not found.has_expired():  # the receiver has not closed it
                found.reused = True
                return found
            found.close()
        return Connection(route, tls)

    def give_back(self, connection: Connection) -> None:
        """Keep `connection` for the next attempt if its exchange ended cleanly; else close it."""
        if not connection.reusable or connection.closed:
            connection.close()
            return
        connection.reusable = False  # until its next exchange ends cleanly
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

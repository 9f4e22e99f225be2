"""Keep-alive connections for webhook attempts, each reused only for what it was checked for.

An attempt connects to the address the SSRF guard checked for it (workers/webhooks/client.py), not
to the URL's host name. A pool keyed by that address alone (httpx's, httpcore's) would let two
host names on one address share a connection, and an https connection verified for one name
carry requests for the other. So this small pool is keyed by a Route (scheme, host name, port,
checked address) and the TLS settings it was opened with: a reused connection was verified
against the same name, exactly as a new one would be.

A connection is the standard library's `http.client.HTTPConnection` (connecting to the checked
address, verifying TLS against the host name), chosen over httpcore because it costs a webhook
worker less CPU per attempt (docs/performance.md, "Attempts over http.client"). The request is
the caller's bytes, sent in one write (Connection.exchange).

A taken connection is out of the pool until its thread gives it back, so threads never share
one; only a connection whose answer was read to its end, and not asked to close, comes back.
Idle connections are bounded in number (MAX_IDLE) and age (IDLE_S). One the receiver closed is
dropped when taken, or, closed while the request goes out, lets the attempt retry once on a new
connection (`answered`)."""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import threading
import time
import types
import typing
from dataclasses import dataclass

#: Most idle connections kept, all routes together (a webhook worker runs up to its task threads'
#: attempts at once; each may leave one).
MAX_IDLE = 64
#: An idle connection older than this is closed, not reused: below the 5 s idle timeout of Node's
#: HTTP server (the shortest common default), so we usually close before a receiver does.
IDLE_S = 4.0
#: Most bytes of one answer read from its connection, head and body together: a head larger than
#: this is an error (h11, used before, allowed 16 KiB), and the body is capped far below it
#: (attempt.RESPONSE_CAP_BYTES).
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


class _UntilDeadline(io.RawIOBase):
    """A socket's reads, each given only the time left before a deadline, and none past it, and
    none past ANSWER_CAP_BYTES: an answer's status line, headers and body are all read by then,
    however a receiver drips them (per-read timeouts alone would let a byte per timeout hold an
    attempt for hours), and a head of endless headers costs no more memory than that (http.client
    alone allows 100 lines of 64 KiB). It reads through the socket's own unbuffered makefile (what
    http.client's answer reads from)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline
        self._left_bytes = ANSWER_CAP_BYTES

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: typing.Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer did not come within the attempt's timeout")
        if self._left_bytes <= 0:
            raise AnswerTooLarge(f"the answer went on past {ANSWER_CAP_BYTES} bytes")
        self._sock.settimeout(left)
        with memoryview(buffer) as view:
            read = self._raw.readinto(view[: self._left_bytes])
        self._left_bytes -= read or 0
        return read

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """What http.client.HTTPResponse reads its answer through (it only calls makefile)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_UntilDeadline(self._sock, self._deadline))


#: An answer's head, as http.client reads it: most bytes in one line, most lines (its end's too).
HEAD_LINE_BYTES = 65_536
HEAD_LINES = 100


def read_head(fp: typing.BinaryIO) -> http.client.HTTPMessage:
    """An answer's header lines, read as http.client.parse_headers reads them (the same limits,
    the same HTTPMessage) but stored without email's FeedParser, which is most of the cost of reading
    a head. A value is the text after the colon, leading blanks dropped (email's compat32 policy); a
    folded line continues the last value. A line that is no `name: value` (email ends the head there
    and counts the rest as body) marks the answer `Connection: close`, so its connection is never
    reused on a guess at framing."""
    message = http.client.HTTPMessage()
    pairs: list[list[str]] = []
    for _ in range(HEAD_LINES):  # the blank line that ends the head counts, as in http.client
        line = fp.readline(HEAD_LINE_BYTES + 1)
        if len(line) > HEAD_LINE_BYTES:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            break
        text = line.decode("iso-8859-1").rstrip("\r\n")
        name, colon, value = text.partition(":")
        if text[:1] in (" ", "\t") and pairs:
            pairs[-1][1] += "\r\n" + text  # obsolete line folding, kept as email keeps it
        elif colon and name and not any(c.isspace() for c in name):
            pairs.append([name, value.lstrip(" \t")])
        else:
            pairs.append(["Connection", "close"])
    else:
        raise http.client.HTTPException(f"got more than {HEAD_LINES} headers")
    for name, value in pairs:
        message[name] = value
    return message


class _Answer(http.client.HTTPResponse):
    """http.client's HTTPResponse with the head read by read_head: `begin` is the standard
    library's own code (its status line, 100-continue, chunked, length and keep-alive rules), run
    with read_head where it calls parse_headers (tests/workers/webhooks/test_connections.py checks
    both read every kind of answer alike)."""

    begin = types.FunctionType(
        http.client.HTTPResponse.begin.__code__,
        {**vars(http.client), "parse_headers": read_head},
        "begin",
    )


class _Pinned(http.client.HTTPConnection):
    """An HTTPConnection to the Route's checked address (its socket, and the TLS, for https,
    verified for the Route's name): only its connect and close are used (Connection.exchange)."""

    def __init__(self, route: Route, tls: ssl.SSLContext | None, timeout_s: float | None) -> None:
        super().__init__(route.address, route.port, timeout=timeout_s)
        self._route = route
        self._tls = tls

    def connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._route.host)
        except TimeoutError:
            raise
        except OSError as exc:  # ssl.SSLError is one
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        self.sock = sock


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
        self.http = _Pinned(route, tls if route.scheme == "https" else None, timeout_s=None)

    @property
    def closed(self) -> bool:
        """Whether it holds no open socket (never opened, or closed)."""
        return self.http.sock is None

    def set_timeout(self, timeout_s: float) -> None:
        """Every network wait from now on (connect, each send) is cut at timeout_s; the answer is
        read by exchange()'s deadline."""
        self.http.timeout = timeout_s
        if self.http.sock is not None:
            self.http.sock.settimeout(timeout_s)

    def exchange(self, request: bytes, answer_within_s: float) -> http.client.HTTPResponse:
        """Send `request` (its head and body, whole, in one write; connecting first when it is not
        open) and read its answer's head, the answer (status line, headers and body) read within
        `answer_within_s` of the request going out, or its reads raise TimeoutError. The caller builds the
        head from what it checked once per URL (workers/webhooks/client.py), where http.client's `request()`
        would check and encode each header again on every attempt; http.client's own code reads the
        answer (_Answer)."""
        if self.http.sock is None:
            self.http.connect()
        sock = self.http.sock
        sock.sendall(request)
        reader: typing.Any = _DeadlineSocket(sock, time.monotonic() + answer_within_s)
        answer = _Answer(reader, method="POST")
        try:
            answer.begin()
        except BaseException:
            answer.close()
            raise
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

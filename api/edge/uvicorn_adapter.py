"""genq's one adapter to uvicorn's internals: a timeout on a request's headers, which uvicorn
lacks, and a response's head and body sent in one write, where uvicorn writes them apart.

The header timeout: a connection that has not finished sending a request's headers within
`header_timeout_s` (after connecting, or after the request's first byte) is closed, so a client
trickling its headers (slowloris) cannot hold connections, up to uvicorn's limit_concurrency,
for as long as it likes. uvicorn's public options bound only an idle keep-alive connection.

One write: uvicorn writes a response's status line and headers, then its body, each a send() that
runs the TCP stack and wakes the client (on loopback the sender pays the receiver's side too).
uvicorn's protocol writes through a `OneWriteTransport` (the asyncio Transport interface, nothing
of uvicorn's), which sends the writes of one event-loop turn together at the end of that turn: a
response's start and body always come in one turn; a stream's chunks keep their timing.

How: `HeaderTimeoutProtocol` wraps uvicorn's own httptools protocol, which serves everything as
ever (reads, writes, flow control); the wrapper sees the bytes first, through an httptools parser
of its own (httptools' public API), to learn where each request's headers start and end. Its
one private reach is naming uvicorn's protocol class (`uvicorn.protocols.http.httptools_impl`)
and building it with the arguments uvicorn gives the class it is handed.

The public path is the fallback: `http_protocol()` names this class only on the uvicorn version
it is checked against (tests/api/edge/test_uvicorn_adapter.py); on any other it answers
uvicorn's documented `http="httptools"` and logs `header_timeout_off`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar, cast

import httptools
import uvicorn

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornProtocol
except ImportError:  # another uvicorn: the public path
    _UvicornProtocol = None  # type: ignore[assignment,misc]

log = logging.getLogger("genq.api")

#: The uvicorn this adapter is checked against (pyproject.toml pins it).
PINNED_UVICORN = "0.54.0"
#: uvicorn's documented `http=` option: the path when the adapter's contract does not hold.
PUBLIC_HTTP = "httptools"


def contract_holds() -> bool:
    """This uvicorn is the one the adapter was checked against."""
    return uvicorn.__version__ == PINNED_UVICORN and _UvicornProtocol is not None


def http_protocol() -> str:
    """What `genq api` gives uvicorn's `http=`: this adapter where its contract holds, else the
    public path (no header timeout; logged once at start-up)."""
    if contract_holds():
        return f"{__name__}:HeaderTimeoutProtocol"
    log.warning(
        "header_timeout_off",
        extra={"uvicorn": uvicorn.__version__, "checked_against": PINNED_UVICORN},
    )
    return PUBLIC_HTTP


class OneWriteTransport:
    """A transport whose writes within one event-loop turn reach the socket as one write."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, lines: list[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def close(self) -> None:
        self.flush()  # a response written just before closing (Connection: close) still goes out
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()  # what this protocol wrote goes before what the next one writes
        self._transport.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:
        # The rest (is_closing, get_extra_info, pause_reading, ...) is the transport's own.
        return getattr(self._transport, name)


class HeaderTimeoutProtocol(asyncio.Protocol):
    """uvicorn's httptools protocol, with connections that are slow to send a request's headers
    closed, writing through a OneWriteTransport. uvicorn builds one per connection, from its own
    config."""

    #: Seconds a request's headers may take. The app factory sets it once per process from
    #: GENQ_API_HEADER_TIMEOUT_S (api/app.py), since uvicorn, not genq, builds these objects.
    header_timeout_s: ClassVar[float] = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner: asyncio.Protocol = _UvicornProtocol(*args, **kwargs)
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        #: When the headers now awaited are due (None: none awaited), and the one timer that
        #: checks it: a request costs two stores, not a timer made and cancelled.
        self._due: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass
        self._inner.connection_made(cast(asyncio.Transport, OneWriteTransport(self._transport, self._loop)))
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._parser is not None:
            try:
                self._parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):
                self._stop_watching()  # uvicorn answers a malformed request (400) and any upgrade
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # httptools' callbacks, for this wrapper's own parser (it defines no others, so parses no more).
    def on_message_begin(self) -> None:
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()

    def _arm(self) -> None:
        self._due = self._loop.time() + self.header_timeout_s
        if self._timer is None:
            self._timer = self._loop.call_at(self._due, self._check)

    def _disarm(self) -> None:
        self._due = None

    def _stop_watching(self) -> None:
        self._due = self._parser = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        """The timer: close the connection if the awaited headers are late, else wait again for
        whatever is awaited now (nothing: the next request's first byte arms it anew)."""
        self._timer = None
        if self._due is None:
            return
        if self._loop.time() < self._due:
            self._timer = self._loop.call_at(self._due, self._check)
            return
        self._too_slow()

    def _too_slow(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

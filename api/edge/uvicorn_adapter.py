"""genq's one adapter to uvicorn's internals: a timeout on a request's headers, which uvicorn
lacks. A connection that has not finished sending a request's headers within
`header_timeout_s` (after connecting, or after the request's first byte) is closed, so a client
trickling its headers (slowloris) cannot hold connections, up to uvicorn's limit_concurrency,
for as long as it likes. uvicorn's public options bound only an idle keep-alive connection.

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


class HeaderTimeoutProtocol(asyncio.Protocol):
    """uvicorn's httptools protocol, with connections that are slow to send a request's headers
    closed. uvicorn builds one per connection, from its own config."""

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
        self._inner.connection_made(transport)
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

"""uvicorn's httptools protocol, with each response written to the socket in one `send()`.

Why: uvicorn writes a response's status line and headers, then its body, in two writes; each is
a syscall that runs the TCP stack and wakes the client. Writes issued in one event-loop turn (a
response's start and body always are) go out together at the end of that turn; a streaming
response's chunks keep their timing.

`genq api` runs uvicorn with `http="api.edge.server:OneWriteHttpProtocol"`; everything else in the
protocol is uvicorn's own, plus one timeout uvicorn lacks: a connection that has not finished
sending a request's headers within `header_timeout_s` is closed (slowloris).

And one ASGI extension, CLIENT_GONE: each request's scope carries a future that is done once the
client has gone, so an event stream ends by a callback (api/routes/stream.py EventStream) rather
than by a task waiting on `receive`."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: The scope extension ({"future": asyncio.Future}) done when the request's client has gone.
CLIENT_GONE = "genq.client_gone"


class OneWriteTransport:
    """A transport whose writes within one loop turn reach the socket as one write."""

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
        # Everything else (is_closing, get_extra_info, pause_reading, ...) is the transport's.
        return getattr(self._transport, name)


class OneWriteHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a OneWriteTransport, with a header timeout."""

    #: Seconds a request's headers may take. uvicorn builds protocols itself, from its own config,
    #: so the app factory sets this once per process from GENQ_API_HEADER_TIMEOUT_S (api/app.py).
    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Reads and flow control (pause/resume reading) stay on the real transport.
        self.transport = OneWriteTransport(transport, self.loop)  # type: ignore[assignment]
        self._client_gone: asyncio.Future[None] = self.loop.create_future()
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions = self.scope.setdefault("extensions", {})
        extensions[CLIENT_GONE] = {"future": self._client_gone}
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if not self._client_gone.done():
            self._client_gone.set_result(None)
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

"""Request body size cap as raw ASGI middleware: a body over the cap gets 413 before any of it is
parsed, whether or not the client sent Content-Length. A request answered before its body was
read to its end (a 413 here, or an upload refused before it read its body) closes its connection,
once the rest of the body (within bounds) has been read and dropped, so the client gets its answer."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.edge.asgi import Linger, closing_unread, read_body, replay
from api.edge.errors import genq_error_response
from shared.errors import PayloadTooLarge

#: Room for a multipart upload's boundaries and small fields beyond the file's own cap.
MULTIPART_OVERHEAD = 1 << 20


class BodySizeLimit:
    """`max_bytes` for every path, except those in `per_path` (file uploads: their own cap). A
    body left unread by an early answer is read and dropped within `linger`, then the connection
    closes (api/edge/asgi.py closing_unread)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, linger: Linger, per_path: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.linger = linger
        self.per_path = per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.per_path.get(scope["path"], self.max_bytes)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        too_long = declared is not None and declared.isdigit() and int(declared) > max_bytes
        if scope["path"] in self.per_path:  # an upload reads and counts its own body, if its caller may
            receive_unread, send_closing = closing_unread(scope, receive, send, self.linger)
            # One declared too long is refused as the upload starts reading: after its caller
            # was authenticated, in the upload route's own shape.
            refused = PayloadTooLarge(f"the request body exceeds {max_bytes} bytes", param="file")
            await self.app(scope, refusing(refused) if too_long else receive_unread, send_closing)
            return
        if too_long:
            await self._reject(scope, receive, send, max_bytes)
            return
        if declared is not None or b"transfer-encoding" not in headers:
            # Content-Length: the server enforces it, nothing more can arrive. Neither header: the
            # request has no body (RFC 9112, 6.3), as a poll's GET has none; nothing to read.
            await self.app(scope, receive, send)
            return
        # Chunked: read it here (bounded), then replay it. Raising from inside `receive` would
        # not do: FastAPI reports any error while reading a body as malformed JSON.
        body = await read_body(receive, max_bytes)
        if body is None:
            await self._reject(scope, receive, send, max_bytes)
            return
        await self.app(scope, replay(body, receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        error = PayloadTooLarge(f"the request body exceeds {max_bytes} bytes")
        await genq_error_response(error)(scope, *closing_unread(scope, receive, send, self.linger))


def refusing(error: Exception) -> Receive:
    """A receive channel that raises `error` instead of reading any of the body."""

    async def receive_none() -> Message:
        raise error

    return receive_none

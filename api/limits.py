"""Request body size cap as raw ASGI middleware: a body over the cap gets 413 before any of it is
parsed, whether or not the client sent Content-Length."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import genq_error_response
from shared.errors import PayloadTooLarge


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLarge(f"the request body exceeds {self.max_bytes} bytes")
        await genq_error_response(error)(scope, receive, send)


class _TooLarge(Exception):
    pass

"""Request body size cap as raw ASGI middleware: a body over the cap gets 413 before any of it is
parsed, whether or not the client sent Content-Length."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from api.asgi import read_body, replay
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
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._reject(scope, receive, send)
            else:  # the server enforces Content-Length: nothing more can arrive
                await self.app(scope, receive, send)
            return
        # Chunked: read it here (bounded), then replay it. Raising from inside `receive` would
        # not do: FastAPI reports any error while reading a body as malformed JSON.
        body = await read_body(receive, self.max_bytes)
        if body is None:
            await self._reject(scope, receive, send)
            return
        await self.app(scope, replay(body, receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLarge(f"the request body exceeds {self.max_bytes} bytes")
        await genq_error_response(error)(scope, receive, send)

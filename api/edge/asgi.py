"""Small raw-ASGI helpers shared by the layers that read a request body before FastAPI does."""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive, max_bytes: int | None = None) -> bytes | None:
    """The whole request body, or None once it grows past max_bytes (no bound when None)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive channel that yields `body` (already read) first, then the original channel's
    messages (a disconnect)."""
    replayed = False

    async def receive_again() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_again

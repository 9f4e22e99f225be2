"""Small raw-ASGI helpers shared by the layers that read a request body before FastAPI does."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send


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


def closing_unread(scope: Scope, receive: Receive, send: Send) -> tuple[Receive, Send]:
    """The request's channels, with a response that starts before the request's body was read
    to its end asking the server to close the connection (`Connection: close`): a client refused
    early (no key, over its rate limit or a cap) is not left sending a body nobody reads, which
    the server would otherwise take in and drop to keep the connection open."""
    headers = dict(scope["headers"])
    read = b"transfer-encoding" not in headers and headers.get(b"content-length", b"0") in (b"0", b"")

    async def receive_counted() -> Message:
        nonlocal read
        message = await receive()
        read = read or message["type"] != "http.request" or not message.get("more_body", False)
        return message

    async def send_closing(message: Message) -> None:
        if message["type"] == "http.response.start" and not read:
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return receive_counted, send_closing

"""Small raw-ASGI helpers shared by the layers that read a request body before FastAPI does."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Linger:
    """How much of a request body left unread when its answer was sent the server still reads,
    and drops, before it closes the connection (nginx's lingering close)."""

    #: Body bytes read and dropped after the answer, at most.
    max_bytes: int
    #: Seconds spent reading them, at most.
    seconds: float


def closing_unread(scope: Scope, receive: Receive, send: Send, linger: Linger) -> tuple[Receive, Send]:
    """The request's channels, with a response that starts before the request's body was read
    to its end asking the server to close the connection (`Connection: close`): a client refused
    early (no key, over its rate limit or a cap) is not left sending a body nobody reads, which
    the server would otherwise take in and drop, unbounded, to keep the connection open.

    Before that close, the rest of the body is read and dropped within `linger`, the answer
    already written: closing a socket with unread bytes in its buffer makes the kernel send a
    reset, and a client that reads its answer only once it has sent its whole body (httpx, so the
    OpenAI SDK) loses the answer to it. Past the bounds the connection closes anyway."""
    headers = dict(scope["headers"])
    read = b"transfer-encoding" not in headers and headers.get(b"content-length", b"0") in (b"0", b"")
    lingering = False

    async def receive_counted() -> Message:
        nonlocal read
        message = await receive()
        read = read or message["type"] != "http.request" or not message.get("more_body", False)
        return message

    async def send_closing(message: Message) -> None:
        nonlocal lingering
        if message["type"] == "http.response.start" and not read:
            lingering = True
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        elif lingering and message["type"] == "http.response.body" and not message.get("more_body", False):
            # The answer goes out whole now; the server closes the connection only once the
            # response ends, so it ends after the drain.
            await send({**message, "more_body": True})
            if not read:
                await drain(receive_counted, linger)
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    return receive_counted, send_closing


async def drain(receive: Receive, linger: Linger) -> None:
    """Reads and drops the rest of a request body, until its end, a disconnect, or past
    linger's bytes or seconds. Nothing is kept: the cost is the reading alone."""
    left = linger.max_bytes
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(linger.seconds):
            while left >= 0:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                left -= len(message.get("body", b""))

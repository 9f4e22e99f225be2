"""api/edge/asgi.py: reading a raw ASGI request body whole (bounded), and handing it on as if it
had not been read."""

from __future__ import annotations

import pytest
from starlette.types import Message, Receive

from api.edge.asgi import read_body, replay

pytestmark = pytest.mark.anyio


def channel(*chunks: bytes) -> tuple[Receive, list[Message]]:
    """A receive channel sending the body in these chunks, then a disconnect; and what it sent."""
    messages: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    messages.append({"type": "http.disconnect"})
    sent: list[Message] = []

    async def receive() -> Message:
        sent.append(messages[len(sent)])
        return sent[-1]

    return receive, sent


async def test_a_body_in_chunks_is_read_whole() -> None:
    receive, sent = channel(b"ab", b"", b"cd", b"e")
    assert await read_body(receive) == b"abcde"
    assert len(sent) == 4  # it stops at the last chunk: the disconnect is left for the app


async def test_a_body_at_the_bound_is_read_and_one_past_it_is_not() -> None:
    assert await read_body(channel(b"abc", b"de")[0], max_bytes=5) == b"abcde"
    receive, sent = channel(b"abc", b"def", b"ghi")
    assert await read_body(receive, max_bytes=5) is None
    assert len(sent) == 2  # it stops reading once past the bound


async def test_a_replayed_body_comes_first_then_the_channel_goes_on() -> None:
    receive, _ = channel(b"ab", b"cd")
    body = await read_body(receive)
    assert body is not None
    again = replay(body, receive)
    assert await again() == {"type": "http.request", "body": b"abcd", "more_body": False}
    assert await again() == {"type": "http.disconnect"}

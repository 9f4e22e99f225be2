"""api/edge/limits.py: a body over the cap gets 413 before the app reads any of it, whether it
declared its length or came chunked; a body within the cap reaches the app whole; an upload path
has a cap of its own and checks a chunked upload itself."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from api.edge.asgi import Linger, read_body
from api.edge.errors import genq_error_response
from api.edge.limits import BodySizeLimit
from shared.errors import GenqError

# A body lost on its way to the app shows as a request waiting forever: fail fast instead.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

CAP = 1000
UPLOAD_CAP = 5000
LINGER = Linger(max_bytes=1 << 20, seconds=5.0)


class Echo:
    """An app that reads its request body and answers its length; it records what reached it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(receive)
        except GenqError as refused:  # as the upload route answers its errors
            await genq_error_response(refused)(scope, receive, send)
            return
        assert body is not None
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


async def chunked(body: bytes) -> AsyncIterator[bytes]:
    """A body without Content-Length (httpx sends Transfer-Encoding: chunked)."""
    for start in range(0, len(body), 300):
        yield body[start : start + 300]


@pytest.fixture
async def limited() -> AsyncIterator[tuple[httpx.AsyncClient, Echo]]:
    echo = Echo()
    app = BodySizeLimit(echo, max_bytes=CAP, linger=LINGER, per_path={"/v1/files": UPLOAD_CAP})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        yield client, echo


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_over_the_cap_is_413_and_reaches_nothing(
    limited: tuple[httpx.AsyncClient, Echo], declared: bool
) -> None:
    client, echo = limited
    body = b"x" * (CAP + 1)
    content: Any = body if declared else chunked(body)
    response = await client.post("/v1/jobs", content=content)
    assert response.status_code == 413
    assert response.json()["error"] == {
        "type": "payload_too_large",
        "message": f"the request body exceeds {CAP} bytes",
        "param": None,
    }
    assert echo.bodies == []


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_at_the_cap_the_app_reads_the_whole_body(
    limited: tuple[httpx.AsyncClient, Echo], declared: bool
) -> None:
    client, echo = limited
    body = bytes(range(256)) * 3 + b"y" * (CAP - 768)
    response = await client.post("/v1/jobs", content=body if declared else chunked(body))
    assert response.status_code == 200
    assert echo.bodies == [body]


async def test_an_upload_path_has_its_own_cap(limited: tuple[httpx.AsyncClient, Echo]) -> None:
    client, echo = limited
    assert (await client.post("/v1/files", content=b"u" * UPLOAD_CAP)).status_code == 200
    # Declared too long: refused when the upload first reads (after its caller was checked).
    refused = await client.post("/v1/files", content=b"u" * (UPLOAD_CAP + 1))
    assert refused.status_code == 413 and refused.json()["error"]["param"] == "file"
    # Chunked, it goes on unread: the upload counts its bytes as it stores them (api/batches/files.py).
    assert (await client.post("/v1/files", content=chunked(b"u" * (UPLOAD_CAP + 1)))).status_code == 200
    assert [len(body) for body in echo.bodies] == [UPLOAD_CAP, UPLOAD_CAP + 1]


class Refuses:
    """An upload route that answers before reading its body (a caller without a key)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_an_answer_before_the_body_was_read_closes_the_connection(declared: bool) -> None:
    """So the refused client stops sending instead of the server taking the rest in to drop it."""
    body = b"u" * 3000
    for app, path, closes in [
        (
            BodySizeLimit(Refuses(), max_bytes=CAP, linger=LINGER, per_path={"/v1/files": UPLOAD_CAP}),
            "/v1/files",
            True,
        ),
        (
            BodySizeLimit(Echo(), max_bytes=CAP, linger=LINGER, per_path={"/v1/files": UPLOAD_CAP}),
            "/v1/files",
            False,
        ),
        (BodySizeLimit(Echo(), max_bytes=CAP, linger=LINGER), "/v1/jobs", True),  # 413
    ]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as client:
            response = await client.post(path, content=body if declared else chunked(body))
        assert (response.headers.get("connection") == "close") is closes, (path, response.status_code)


async def test_a_request_without_a_body_reaches_the_app_with_the_servers_own_receive() -> None:
    """No Content-Length and no Transfer-Encoding: no body (a poll's GET), so the cap reads and
    replays nothing and the app gets the server's receive channel itself (a long-poll sees its
    client leave on it as ever)."""
    reached: list[Receive] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(receive)

    async def server_receive() -> Message:
        raise AssertionError("nothing is read for a request without a body")

    async def send(message: Message) -> None:
        raise AssertionError("nothing is sent by the cap")

    limited = BodySizeLimit(app, max_bytes=CAP, linger=LINGER)
    scope = {"type": "http", "method": "GET", "path": "/v1/jobs/j1", "headers": [(b"host", b"localhost")]}
    await limited(scope, server_receive, send)
    assert reached == [server_receive]

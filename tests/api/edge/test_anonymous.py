"""api/edge/anonymous.py: what an API without keys refuses before anything else runs, table-driven
on the request line and headers, and the guard in front of an app. (tests/api/test_exposure.py
checks the same promises through the whole app, hot paths included.)"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from api.edge.anonymous import AnonymousGuard, refusal_of
from shared.errors import Forbidden, UnsupportedMediaType

pytestmark = pytest.mark.anyio

ALLOWED = frozenset({"localhost", "127.0.0.1", "[::1]"})


JSON = "application/json"
MULTIPART = "multipart/form-data; boundary=b"
AUTH = "Bearer x"

#: (method, path, Host, Content-Type, body length (None: chunked, 0: none), Authorization, refusal)
CASES: list[tuple[str, str, str | None, str | None, int | None, str | None, type | None]] = [
    ("GET", "/v1/jobs", "localhost", None, 0, None, None),
    ("GET", "/v1/jobs", "LOCALHOST:8000", None, 0, None, None),
    ("GET", "/v1/jobs", "[::1]:8000", None, 0, None, None),
    ("GET", "/v1/jobs", "127.0.0.1:80", None, 0, None, None),
    ("GET", "/v1/jobs", "evil.example", None, 0, None, Forbidden),
    ("GET", "/v1/jobs", "evil.example:8000", None, 0, None, Forbidden),
    ("GET", "/v1/jobs", "localhost.evil.example", None, 0, None, Forbidden),
    ("GET", "/v1/jobs", None, None, 0, None, Forbidden),  # no Host at all
    ("GET", "/healthz", "10.0.0.7:8000", None, 0, None, None),  # probes answer under any name
    ("GET", "/readyz", "10.0.0.7:8000", None, 0, None, None),
    ("POST", "/v1/jobs", "localhost", JSON, 2, None, None),
    ("POST", "/v1/jobs", "localhost", "Application/JSON; charset=utf-8", 2, None, None),
    ("POST", "/v1/jobs", "localhost", "text/plain", 2, None, UnsupportedMediaType),
    ("POST", "/v1/jobs", "localhost", None, 2, None, UnsupportedMediaType),
    ("POST", "/v1/jobs", "localhost", "application/x-www-form-urlencoded", None, None, UnsupportedMediaType),
    ("POST", "/v1/jobs/x/cancel", "localhost", None, 0, None, None),  # no body, no type needed
    ("POST", "/v1/files", "localhost", MULTIPART, 9, AUTH, None),
    ("POST", "/v1/files", "localhost", MULTIPART, 9, None, UnsupportedMediaType),
    ("POST", "/v1/jobs", "localhost", MULTIPART, 9, AUTH, UnsupportedMediaType),  # uploads go to /v1/files
]


def scope_of(method: str, path: str, host: str | None, content_type: str | None, length: int | None,
             authorization: str | None) -> dict[str, Any]:  # fmt: skip
    headers = {"host": host, "content-type": content_type, "authorization": authorization}
    headers |= {"transfer-encoding": "chunked"} if length is None else {"content-length": str(length)}
    raw = [(name.encode(), value.encode()) for name, value in headers.items() if value is not None]
    return {"type": "http", "method": method, "path": path, "headers": raw}


@pytest.mark.parametrize(
    ("method", "path", "host", "content_type", "length", "authorization", "refusal"), CASES
)
def test_what_an_anonymous_api_refuses(
    method: str, path: str, host: str | None, content_type: str | None, length: int | None,
    authorization: str | None, refusal: type | None,
) -> None:  # fmt: skip
    found = refusal_of(scope_of(method, path, host, content_type, length, authorization), ALLOWED)
    assert (None if found is None else type(found)) is refusal
    if found is not None:
        assert found.param == ("Host" if refusal is Forbidden else "Content-Type")


def test_a_star_serves_every_name() -> None:
    assert (
        refusal_of(scope_of("GET", "/v1/jobs", "anything.example", None, 0, None), frozenset({"*"})) is None
    )
    form = scope_of("POST", "/v1/jobs", "anything.example", "text/plain", 3, None)
    assert isinstance(refusal_of(form, frozenset({"*"})), UnsupportedMediaType)  # bodies stay JSON-only


async def test_the_guard_answers_a_refusal_itself_and_passes_the_rest_on() -> None:
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = AnonymousGuard(app, ["LocalHost"])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=guard), base_url="http://localhost"
    ) as client:
        assert (await client.get("/v1/jobs")).status_code == 204
        refused = await client.get("/v1/jobs", headers={"Host": "evil.example"})
        assert refused.status_code == 403
        assert refused.json()["error"] == {
            "type": "forbidden",
            "message": "this API serves without keys only under the names in GENQ_ALLOWED_HOSTS",
            "param": "Host",
        }
        form = await client.post("/v1/jobs", content=b"a=b", headers={"Content-Type": "text/plain"})
        assert form.status_code == 415 and form.json()["error"]["type"] == "unsupported_media_type"
    assert reached == ["/v1/jobs"]

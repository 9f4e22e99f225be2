"""Every route that serves a caller goes through serve() (api/edge/pipeline.py): each route under
/v1, found by walking the app as built, answers a missing key, an exhausted rate limit, Redis
down and a malformed body as the pipeline does, in its router's shape (OpenAI's for the routes
OpenAI's clients call, genq's elsewhere). A route that bypassed the pipeline (its own owner
dependency, its own error handling) fails one of these; one that asks for a caller without being
a PipelineRoute stops the app at start-up."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import httpx
import pytest
import redis
from fastapi import APIRouter, Depends, Header

from api.app import create_app
from api.edge.auth import owner_of
from api.edge.pipeline import CallerDep, PipelineRoute, ReadLimit, RouteDeclarationError
from api.routes import ops
from api.routes.deps import SettingsDep
from shared.batches import new_batch_id
from shared.config import Settings
from shared.files import new_file_id
from shared.ids import new_id
from tests.conftest import TEST_MODEL, api_client

pytestmark = pytest.mark.anyio

#: The routes whose errors OpenAI's clients parse: `{"error": {"message", "type", "param", "code"}}`,
#: 422 answered as 400. Every other /v1 route answers genq's `{"error": {"type", "message", "param"}}`.
OPENAI_PATHS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/files", "/v1/batches")

#: A value of the right shape for each path parameter, so a route reaches its store.
PATH_VALUES: dict[str, Callable[[], str]] = {
    "job_id": new_id,
    "file_id": new_file_id,
    "batch_id": new_batch_id,
    "model": lambda: TEST_MODEL,
}

#: Routes that answer without Redis (the served models are settings).
NO_STORE = {"/v1/models", "/v1/models/{model}"}


def caller_routes(settings: Settings) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(method, route template, a path to call, OpenAPI operation) of every operation the API
    documents under /v1."""
    for template, operations in create_app(settings).openapi()["paths"].items():
        if template.startswith("/v1/"):
            path = template.format(**{name: make() for name, make in PATH_VALUES.items()})
            for method, operation in operations.items():
                yield method.upper(), template, path, operation


def error_of(template: str, response: httpx.Response) -> dict[str, Any]:
    """The error's status, its fields in the shape `template`'s router promises (a KeyError or an
    extra field fails the comparison), and the headers every refusal of its kind carries."""
    error = response.json()["error"]
    shape = "openai" if template.startswith(OPENAI_PATHS) else "genq"
    fields = ("message", "type", "param", "code") if shape == "openai" else ("type", "message", "param")
    assert tuple(error) == fields, (template, error)
    return {"status": response.status_code, "shape": shape, "type": error["type"],
            "code": error.get("code")}  # fmt: skip


async def call(api: httpx.AsyncClient, method: str, path: str) -> httpx.Response:
    # A body that parses: the caller is asked once the body is read, before it is validated.
    return await api.request(method, path, json={} if method == "POST" else None)


def expected(template: str, genq: dict[str, Any], openai: dict[str, Any]) -> dict[str, Any]:
    return openai if template.startswith(OPENAI_PATHS) else genq


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_every_caller_route_refuses_a_missing_key_in_its_shape(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["the-key"])
    refused = {"status": 401, "code": None}
    genq = refused | {"shape": "genq", "type": "unauthorized"}
    openai = refused | {"shape": "openai", "type": "invalid_request_error", "code": "invalid_api_key"}
    answers, wanted = {}, {}
    async with api_client(settings) as anonymous:
        for method, template, path, _ in caller_routes(settings):
            response = await call(anonymous, method, path)
            assert response.headers["www-authenticate"] == "Bearer", (method, template)
            answers[method, template] = error_of(template, response)
            wanted[method, template] = expected(template, genq, openai)
    assert len(answers) >= 20 and answers == wanted
    assert redis_client.keys("genq:ratelimit:*") == []  # an unknown caller spends nobody's tokens


async def test_every_caller_route_refuses_an_exhausted_limit_with_its_headers(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """One token a kind, spent on the first request of that kind: every later one is a 429 with the
    bucket's state and when to retry, whichever route and router it reaches."""
    settings = make_settings(rate_limit_submit="1/0.001", rate_limit_read="1/0.001")
    limited = {"status": 429}
    genq = limited | {"shape": "genq", "type": "rate_limited", "code": None}
    openai = limited | {"shape": "openai", "type": "rate_limit_error", "code": "rate_limit_exceeded"}
    bucket = {"x-ratelimit-limit": "1", "x-ratelimit-remaining": "0"}
    answers, wanted = {}, {}
    async with api_client(settings) as api:
        assert (await api.get("/v1/jobs")).status_code == 200  # the read token
        assert (await api.post(f"/v1/jobs/{new_id()}/cancel")).status_code == 404  # the submit token
        for method, template, path, _ in caller_routes(settings):
            response = await call(api, method, path)
            assert {name: response.headers.get(name) for name in bucket} == bucket, (method, template)
            # 1,000 s to the next token, less the seconds the routes before this one took (a loaded
            # machine, or make test's parallel processes, can take more than one).
            reset = response.headers.get("x-ratelimit-reset")
            assert reset == response.headers.get("retry-after") and 990 <= int(reset or 0) <= 1000, reset
            answers[method, template] = error_of(template, response)
            wanted[method, template] = expected(template, genq, openai)
    assert answers == wanted


async def test_every_caller_route_answers_redis_down_with_503_in_its_shape(
    make_settings: Callable[..., Settings],
) -> None:
    """Submissions are refused by the rate limit (it fails closed); reads pass it (it fails open)
    and are refused when their work reaches the store, streams before their first byte."""
    settings = make_settings(redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    down = {"status": 503}
    genq = down | {"shape": "genq", "type": "unavailable", "code": None}
    openai = down | {"shape": "openai", "type": "server_error", "code": "unavailable"}
    answers, wanted = {}, {}
    async with api_client(settings) as api:
        for method, template, path, _ in caller_routes(settings):
            response = await call(api, method, path)
            if template in NO_STORE:
                assert response.status_code == 200, (template, response.text)
                continue
            assert response.headers["content-type"] == "application/json", (method, template)
            answers[method, template] = error_of(template, response)
            wanted[method, template] = expected(template, genq, openai)
    assert len(answers) >= 18 and answers == wanted


#: A body each route's parser refuses: JSON cut short, a multipart body without its boundary.
MALFORMED = {
    "application/json": (b'{"prompt": ', "the body is not valid JSON"),
}


async def test_a_malformed_body_is_400_in_its_shape_before_a_token_is_spent(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["the-key"])
    refused: dict[str, str] = {}
    async with api_client(settings, "the-key") as api:
        for method, template, path, operation in caller_routes(settings):
            if "requestBody" not in operation:
                continue
            media = next(iter(operation["requestBody"]["content"]))
            if media == "multipart/form-data":  # an upload reads its body once its caller is checked
                continue
            body, message = MALFORMED[media]
            response = await api.request(method, path, content=body, headers={"content-type": media})
            assert response.status_code == 400, (template, response.text)
            assert response.json()["error"]["message"] == message
            refused[template] = error_of(template, response)["shape"]
    assert refused == {
        "/v1/jobs": "genq",
        "/v1/chat/completions": "openai",
        "/v1/completions": "openai",
        "/v1/batches": "openai",
    }
    assert redis_client.keys("genq:ratelimit:*") == []  # refused before anyone was asked who they are


# --- a route that serves a caller off the pipeline stops the app ------------------------------------


async def asks_caller(owner: CallerDep) -> str:
    """An endpoint that asks for its caller."""
    return owner


async def own_owner(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> str:
    """A hand-made owner dependency: authentication without the caller's rate limit."""
    return owner_of(authorization, settings)


async def reads_key(owner: Annotated[str, Depends(own_owner)]) -> str:
    """An endpoint that authenticates its caller its own way."""
    return owner


async def limited() -> None:
    """An endpoint that declares a rate limit but no caller."""


STRAYS: list[tuple[Callable[..., Any], list[Any], str]] = [
    (asks_caller, [], r"/v1/stray asks for its caller \(CallerDep\) but is not a PipelineRoute"),
    (limited, [ReadLimit], "/v1/stray asks for a rate limit but is not a PipelineRoute"),
    (reads_key, [], r"/v1/stray asks for the Authorization header \(in own_owner\)"),
]


@pytest.mark.parametrize(
    ("endpoint", "dependencies", "message"), STRAYS, ids=["CallerDep", "rate limit", "own owner dependency"]
)
def test_a_route_serving_a_caller_off_the_pipeline_stops_the_app(
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    endpoint: Callable[..., Any],
    dependencies: list[Any],
    message: str,
) -> None:
    stray = APIRouter()  # FastAPI's own route class: nothing of serve() runs
    stray.add_api_route("/v1/stray", endpoint, dependencies=dependencies)
    stray.include_router(ops.router)
    monkeypatch.setattr(ops, "router", stray)
    with pytest.raises(RouteDeclarationError, match=message):
        create_app(make_settings())


async def test_the_same_route_on_the_pipeline_starts_and_serves_its_caller(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = APIRouter(route_class=PipelineRoute)
    served.add_api_route("/v1/stray", asks_caller, dependencies=[ReadLimit])
    served.include_router(ops.router)
    monkeypatch.setattr(ops, "router", served)
    settings = make_settings(api_keys=["the-key"])
    async with api_client(settings) as anonymous, api_client(settings, "the-key") as known:
        assert (await anonymous.get("/v1/stray")).status_code == 401
        answer = await known.get("/v1/stray")
    assert answer.status_code == 200 and answer.json().startswith("key-")
    assert answer.headers["x-ratelimit-remaining"] == "99999"

"""The raw-ASGI hot path (api/routes/hotpath.py) answers exactly as the FastAPI routes do, and really
serves the requests it claims: every case below is sent to an app with it on and one with it off,
and the answers compared — status, body and header values — across the request shapes, and
across states: an idempotent replay and its 409, `Prefer: wait`, a cache hit, a long-poll, a full
queue (503 overloaded) and Redis down (503 unavailable)."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from fastapi import APIRouter, Depends
from prometheus_client import REGISTRY
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.app import create_app
from api.edge.pipeline import PipelineRoute, ReadLimit, RouteDeclarationError, SubmitLimit, caller_owner
from api.routes import jobs, stream
from api.routes.hotpath import HotPathMismatch, HotRoutes
from api.routes.jobs import get_job, submit_job
from api.routes.stream import stream_job
from shared import keys
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client, assert_nothing_written

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}

#: (name, method, path, request kwargs). Paths with "{job}" get the id of a job made beforehand.
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("submit", "POST", "/v1/jobs",
     {"json": {"prompt": "hot path parity", "metadata": {"k": "v"}, "cache": False}}),
    ("submit messages", "POST", "/v1/jobs",
     {"json": {"messages": [{"role": "user", "content": "hi"}], "priority": "batch", "seed": 3,
               "cache": False}}),
    ("charset", "POST", "/v1/jobs",
     {"content": b'{"prompt": "x"}', "headers": {"content-type": "application/json; charset=utf-8"}}),
    ("over the cap", "POST", "/v1/jobs", {"json": {"prompt": "x", "max_tokens": 5000}}),
    ("unknown model", "POST", "/v1/jobs", {"json": {"prompt": "x", "model": "gpt-9"}}),
    ("private webhook", "POST", "/v1/jobs", {"json": {"prompt": "x", "webhook": "http://10.0.0.1/h"}}),
    ("prefer too long a wait", "POST", "/v1/jobs",
     {"json": {"prompt": "x"}, "headers": {"Prefer": "wait=999"}}),
    ("malformed", "POST", "/v1/jobs", {"content": b'{"prompt": "x"', "headers": JSON}),
    ("unknown field", "POST", "/v1/jobs", {"json": {"prompt": "x", "colour": "blue"}}),
    ("neither input", "POST", "/v1/jobs", {"json": {}}),
    ("not json", "POST", "/v1/jobs",
     {"content": b'{"prompt": "x"}', "headers": {"content-type": "text/plain"}}),
    ("empty body", "POST", "/v1/jobs", {"content": b"", "headers": JSON}),
    ("long idempotency key", "POST", "/v1/jobs",
     {"json": {"prompt": "x"}, "headers": {"Idempotency-Key": "k" * 300}}),
    ("long prefer", "POST", "/v1/jobs", {"json": {"prompt": "x"}, "headers": {"Prefer": "x" * 300}}),
    ("get", "GET", "/v1/jobs/{job}", {}),
    ("get unknown", "GET", "/v1/jobs/no-such-job", {}),
    ("get overlong id", "GET", "/v1/jobs/" + "x" * 65, {}),
    ("get with wait", "GET", "/v1/jobs/{job}?wait=0", {}),
    ("long-poll", "GET", "/v1/jobs/{job}?wait=0.3", {}),
    ("long-poll past the most", "GET", "/v1/jobs/{job}?wait=999", {}),
    ("long-poll unknown", "GET", "/v1/jobs/no-such-job?wait=0.3", {}),
    ("negative wait", "GET", "/v1/jobs/{job}?wait=-1", {}),
    ("wait and more", "GET", "/v1/jobs/{job}?wait=1&x=2", {}),
    ("wait not a number", "GET", "/v1/jobs/{job}?wait=soon", {}),
    ("stream unknown", "GET", "/v1/jobs/no-such-job/stream", {}),
    ("stream overlong id", "GET", "/v1/jobs/" + "x" * 65 + "/stream", {}),
    ("stream and a query", "GET", "/v1/jobs/no-such-job/stream?x=1", {}),
    ("stream after no event id", "GET", "/v1/jobs/{job}/stream", {"headers": {"Last-Event-ID": "nope"}}),
    ("stream after an overlong id", "GET", "/v1/jobs/{job}/stream",
     {"headers": {"Last-Event-ID": "1-" * 40}}),
]  # fmt: skip

#: Fields of a job that differ between two submissions of the same request.
PER_JOB = {"id", "created_at", "urls"}


async def answers(settings: Settings, key: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with api_client(settings, key) as api:
        job_id = (await api.post("/v1/jobs", json={"prompt": "the job to read"})).json()["id"]
        for name, method, path, kwargs in CASES:
            response = await api.request(method, path.replace("{job}", job_id), **kwargs)
            results[name] = exact(response)
    return results


async def test_hot_path_answers_like_the_fastapi_routes(make_settings: Callable[..., Settings]) -> None:
    """Status, body and header values; each way under its own key (its own rate-limit bucket)."""
    keys_ = ["hot-key", "routed-key"]
    hot = await answers(make_settings(api_keys=keys_, api_hot_paths=True), "hot-key")
    routed = await answers(make_settings(api_keys=keys_, api_hot_paths=False), "routed-key")
    for name, *_ in CASES:
        assert hot[name] == routed[name], (name, differences(hot[name], routed[name]))
    assert hot["submit"]["status"] == 202 and "location" in hot["submit"]["header names"]
    assert hot["over the cap"]["body"]["error"]["param"] == "max_tokens"
    assert hot["malformed"]["status"] == 400
    assert hot["get unknown"]["status"] == 404
    assert hot["stream unknown"]["status"] == 404
    assert hot["stream after no event id"]["body"]["error"]["param"] == "Last-Event-ID"
    assert hot["stream after an overlong id"]["status"] == 422


async def test_auth_and_rate_limits_hold_on_the_hot_path(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["k1"], rate_limit_submit="2/0.01", rate_limit_read="1000/1000")
    async with api_client(settings) as anonymous:
        refused = await anonymous.post("/v1/jobs", json={"prompt": "x"})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert (await anonymous.get("/v1/jobs/anything")).status_code == 401
        assert_nothing_written(redis_client)
    async with api_client(settings, "k1") as api:
        first = await api.post("/v1/jobs", json={"prompt": "x"})
        assert first.status_code == 202 and first.headers["x-ratelimit-remaining"] == "1"
        assert (await api.post("/v1/jobs", json={"prompt": "y"})).status_code == 202
        limited = await api.post("/v1/jobs", json={"prompt": "z"})
        assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limited"
        assert limited.headers["retry-after"] and limited.headers["x-ratelimit-limit"] == "2"
        read = await api.get(f"/v1/jobs/{first.json()['id']}")
        assert read.status_code == 200 and read.headers["x-ratelimit-limit"] == "1000"
    assert len(redis_client.keys("genq:job:*")) == 2


@pytest.mark.parametrize("hot_paths", [True, False])
async def test_the_caller_is_asked_where_fastapi_asks_it(
    make_settings: Callable[..., Settings], hot_paths: bool
) -> None:
    """serve() authenticates when the work first asks, so FastAPI's order holds: a malformed body
    is a 400 whoever sends it and spends no token; a well-formed but invalid one is a 401 without
    a key, and spends one with it (then 429)."""
    key = f"order-{hot_paths}"  # a bucket of its own
    settings = make_settings(api_keys=[key], rate_limit_submit="1/0.001", api_hot_paths=hot_paths)
    malformed = b'{"prompt": '
    async with api_client(settings) as anonymous:
        assert (await anonymous.post("/v1/jobs", content=malformed, headers=JSON)).status_code == 400
        assert (await anonymous.post("/v1/jobs", json={"prompt": "x", "colour": "blue"})).status_code == 401
    async with api_client(settings, key) as api:
        assert (await api.post("/v1/jobs", content=malformed, headers=JSON)).status_code == 400
        assert (await api.post("/v1/jobs", json={"prompt": "x", "colour": "blue"})).status_code == 422
        assert (await api.post("/v1/jobs", json={"prompt": "x"})).status_code == 429


async def test_requests_of_the_common_shape_skip_fastapi(make_settings: Callable[..., Settings]) -> None:
    """With FastAPI's owner dependency broken, the FastAPI routes fail and the hot path does not:
    proof that the hot path, not the router, served them (it asks serve()'s caller directly)."""

    def broken() -> str:
        raise RuntimeError("FastAPI dependency reached")

    for hot_paths in (True, False):
        async with api_client(make_settings(api_hot_paths=hot_paths)) as api:
            app = api._transport.app  # type: ignore[attr-defined]
            app.dependency_overrides[caller_owner] = broken
            try:
                submitted = await api.post("/v1/jobs", json={"prompt": f"skip fastapi {hot_paths}"})
            except RuntimeError:
                assert not hot_paths
                continue
            assert hot_paths and submitted.status_code == 202
            assert (await api.get(submitted.headers["location"])).status_code == 200
            long_poll = await api.get(submitted.headers["location"], params={"wait": "0.2"})
            assert long_poll.status_code == 200 and long_poll.json()["status"] == "queued"
            assert (await api.get("/v1/jobs/no-such-job/stream")).status_code == 404
            with pytest.raises(RuntimeError):  # anything else still goes through FastAPI
                await api.get("/v1/jobs")


async def test_hot_path_requests_are_counted_by_route_template(api: httpx.AsyncClient) -> None:
    def served(route: str, method: str, status: str) -> float:
        labels = {"route": route, "method": method, "status": status}
        return REGISTRY.get_sample_value("genq_http_requests_total", labels) or 0.0

    def counts() -> tuple[float, ...]:
        return (served("/v1/jobs", "POST", "202"), served("/v1/jobs/{job_id}", "GET", "404"),
                served("/v1/jobs/{job_id}/stream", "GET", "404"))  # fmt: skip

    before = counts()
    response = await api.post("/v1/jobs", json={"prompt": "counted"}, headers={"X-Request-ID": "req-42"})
    assert response.headers["x-request-id"] == "req-42"
    assert len((await api.get("/v1/jobs/missing")).headers["x-request-id"]) == 32
    assert len((await api.get("/v1/jobs/missing/stream")).headers["x-request-id"]) == 32
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1)


#: Headers whose values differ between any two answers (or name the job): compared by name only.
VARYING_HEADERS = {"date", "server", "content-length", "x-request-id", "location", "x-ratelimit-reset"}

#: Requests in order, each depending on the state the ones before left (the same key throughout).
#: First with no worker running (so the job stays queued): an idempotent submit, its replay, the
#: same key with another body (409).
IDEMPOTENT: list[tuple[str, str, str, dict[str, Any]]] = [
    ("idempotent", "POST", "/v1/jobs",
     {"json": {"prompt": "once", "cache": False}, "headers": {"Idempotency-Key": "parity-1"}}),
    ("replay", "POST", "/v1/jobs",
     {"json": {"prompt": "once", "cache": False}, "headers": {"Idempotency-Key": "parity-1"}}),
    ("conflict", "POST", "/v1/jobs",
     {"json": {"prompt": "twice", "cache": False}, "headers": {"Idempotency-Key": "parity-1"}}),
]  # fmt: skip
#: Then with a worker: a `Prefer: wait` submit it finishes, its cache hit, a long-poll of it.
FINISHED: list[tuple[str, str, str, dict[str, Any]]] = [
    ("prefer wait", "POST", "/v1/jobs",
     {"json": {"prompt": "parity, cached", "max_tokens": 3}, "headers": {"Prefer": "wait=20"}}),
    ("cache hit", "POST", "/v1/jobs", {"json": {"prompt": "parity, cached", "max_tokens": 3}}),
    ("long-poll a finished job", "GET", "/v1/jobs/{first}?wait=5", {}),
    ("stream a finished job", "GET", "/v1/jobs/{first}/stream", {}),
    ("resume its stream", "GET", "/v1/jobs/{first}/stream", {"headers": {"Last-Event-ID": "final"}}),
]  # fmt: skip

#: With the queue full (GENQ_MAX_QUEUE_LENGTH) and with Redis down: no worker needed.
REFUSALS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("submit", "POST", "/v1/jobs", {"json": {"prompt": "refused", "cache": False}}),
    ("get", "GET", "/v1/jobs/9b2f6c1e-3f7a-4c55-9d0e-1a2b3c4d5e6f", {}),
]


#: Fields of a finished job that differ between two runs of it.
PER_RUN = {"started_at", "completed_at", "metrics", "worker"}


def exact(response: httpx.Response) -> dict[str, Any]:
    """Status, body and header values (those that can be equal), for an exact comparison."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        headers = {name: value for name, value in response.headers.items() if name not in VARYING_HEADERS}
        return {"status": response.status_code, "body": sse_events(response.text), "headers": headers,
                "header names": sorted(response.headers)}  # fmt: skip
    body = response.json()
    if "id" in body:
        body = {key: value for key, value in body.items() if key not in PER_JOB | PER_RUN}
    headers = {name: value for name, value in response.headers.items() if name not in VARYING_HEADERS}
    return {"status": response.status_code, "body": body, "headers": headers,
            "header names": sorted(response.headers)}  # fmt: skip


def sse_events(text: str) -> list[dict[str, Any]]:
    """An event stream's events, with what differs between two runs of a job left out (the entry
    ids, the job's own fields)."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        data = json.loads(fields.get("data", "null"))
        if fields.get("event") == "done":
            data = {key: value for key, value in data.items() if key not in PER_JOB | PER_RUN}
        events.append({"event": fields.get("event"), "data": data})
    return events


async def run_cases(
    settings: Settings, key: str, cases: list[tuple[str, str, str, dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    first = ""
    async with api_client(settings, key) as api:
        for name, method, path, kwargs in cases:
            response = await api.request(method, path.replace("{first}", first), **kwargs)
            first = first or response.json().get("id", "")
            results[name] = exact(response)
    return results


async def test_hot_path_answers_alike_in_every_state(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Both ways, each under its own key (its own rate-limit bucket, cache and idempotency keys),
    answer every request of the same sequence with the same status, body and header values."""
    keys_ = ["hot-key", "routed-key"]
    hot_settings = make_settings(api_keys=keys_, api_hot_paths=True)
    routed_settings = make_settings(api_keys=keys_, api_hot_paths=False)
    hot = await run_cases(hot_settings, "hot-key", IDEMPOTENT)
    routed = await run_cases(routed_settings, "routed-key", IDEMPOTENT)
    start_worker(make_settings(placeholder_step_s=0.01))
    hot |= await run_cases(hot_settings, "hot-key", FINISHED)
    routed |= await run_cases(routed_settings, "routed-key", FINISHED)
    for name, *_ in IDEMPOTENT + FINISHED:
        assert hot[name] == routed[name], (name, differences(hot[name], routed[name]))
    assert [hot[name]["status"] for name, *_ in IDEMPOTENT + FINISHED] == [
        202,
        200,
        409,
        200,
        200,
        200,
        200,
        200,
    ]
    assert hot["cache hit"]["body"]["cached"] is True
    streamed = hot["stream a finished job"]["body"]
    assert [event["event"] for event in streamed][-1] == "done" and streamed[-1]["data"][
        "status"
    ] == "succeeded"
    assert [event["event"] for event in hot["resume its stream"]["body"]] == ["done"]


async def test_hot_path_refuses_alike_when_the_queue_is_full_or_redis_is_down(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    full = {"max_queue_length": 1}
    redis_client.zadd(keys.queued(keys.queue_for_model("placeholder-echo")), {"queued-ahead": 1})
    hot = await run_cases(make_settings(api_hot_paths=True, **full), "", REFUSALS[:1])
    routed = await run_cases(make_settings(api_hot_paths=False, **full), "", REFUSALS[:1])
    assert hot == routed and hot["submit"]["body"]["error"]["type"] == "overloaded", hot
    down = {"redis_url": f"redis://127.0.0.1:{closed_port()}/0"}
    hot = await run_cases(make_settings(api_hot_paths=True, **down), "", REFUSALS)
    routed = await run_cases(make_settings(api_hot_paths=False, **down), "", REFUSALS)
    assert hot == routed and {answer["status"] for answer in hot.values()} == {503}, hot


async def test_both_ways_send_a_job_byte_for_byte_alike(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """The store builds one typed job view and both ways send it through one encoder: the same
    job read either way is the same bytes, queued, canceled, or finished with output and metrics."""
    hot_settings = make_settings(api_keys=["k"], api_hot_paths=True)
    routed_settings = make_settings(api_keys=["k"], api_hot_paths=False)
    async with api_client(hot_settings, "k") as hot, api_client(routed_settings, "k") as routed:

        async def assert_alike(location: str) -> None:
            for query in ("", "?wait=0.1"):
                hot_body = (await hot.get(location + query)).content
                assert hot_body == (await routed.get(location + query)).content, (location, query)

        queued = await routed.post("/v1/jobs", json={"prompt": "x", "metadata": {"k": "v"}})
        await assert_alike(queued.headers["location"])
        await hot.post(queued.json()["urls"]["cancel"])
        await assert_alike(queued.headers["location"])
        start_worker(make_settings(placeholder_step_s=0.01))
        done = await hot.post(
            "/v1/jobs", json={"prompt": "bytes", "max_tokens": 3}, headers={"Prefer": "wait=20"}
        )
        assert done.json()["status"] == "succeeded" and done.json()["output"] is not None
        await assert_alike(done.headers["location"])


def differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Where two answers differ, part by part (a readable assertion message)."""
    found: dict[str, Any] = {}
    for part in a.keys() | b.keys():
        x, y = a.get(part), b.get(part)
        if isinstance(x, dict) and isinstance(y, dict):
            found |= {
                f"{part}.{k}": (x.get(k), y.get(k)) for k in x.keys() | y.keys() if x.get(k) != y.get(k)
            }
        elif x != y:
            found[part] = (x, y)
    return found


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the hot path mirrors the routes, or the app does not start --------------------------------------
def test_the_hot_path_takes_its_routes_and_limit_kinds_from_the_app(
    make_settings: Callable[..., Settings],
) -> None:
    hot = HotRoutes.of(create_app(make_settings(api_hot_paths=True)).routes)
    assert (hot.submit.path, hot.read.path, hot.stream.path) == (
        "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/stream",
    )  # fmt: skip
    kinds = [
        served.route.kind for served in (hot.submit, hot.read) if isinstance(served.route, PipelineRoute)
    ]
    assert kinds == ["submit", "read"]
    swapped = PipelineRoute("/v1/jobs/{job_id}", get_job, dependencies=[SubmitLimit])
    assert swapped.kind == "submit"
    with pytest.raises(RouteDeclarationError, match="declares 0 rate limits"):
        PipelineRoute("/v1/jobs/{job_id}", get_job)
    with pytest.raises(RouteDeclarationError, match="declares 2 rate limits"):
        PipelineRoute("/v1/jobs/{job_id}", get_job, dependencies=[SubmitLimit, ReadLimit])


async def unauthenticated() -> None:
    """An endpoint that forgot to ask for its caller."""


def test_a_pipeline_route_must_ask_for_its_caller() -> None:
    with pytest.raises(RouteDeclarationError, match="CallerDep"):
        PipelineRoute("/v1/jobs/x", unauthenticated, dependencies=[ReadLimit])


async def audit() -> None:
    """A dependency someone might add to a hot route."""


def audited_router(source: APIRouter, endpoint: Callable[..., Any], **include: Any) -> APIRouter:
    """`source`'s routes, `endpoint`'s with an audit dependency added (or, with `include`, all of
    them included with it, as include_router's dependencies)."""
    router = APIRouter(route_class=PipelineRoute)
    if include:
        router.include_router(source, **include)
        return router
    for route in source.routes:
        assert isinstance(route, PipelineRoute)
        limit = SubmitLimit if route.kind == "submit" else ReadLimit
        added = [Depends(audit)] if route.endpoint is endpoint else []
        router.add_api_route(route.path, route.endpoint, methods=sorted(route.methods or ()),
                             dependencies=[limit, *added], response_model=route.response_model)  # fmt: skip
    return router


@pytest.mark.parametrize(
    ("module", "endpoint", "path"),
    [(jobs, submit_job, "/v1/jobs"), (jobs, get_job, "/v1/jobs/{job_id}"),
     (stream, stream_job, "/v1/jobs/{job_id}/stream")],
    ids=["submit", "read", "stream"],
)  # fmt: skip
def test_a_dependency_the_hot_path_does_not_run_stops_the_app(
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    endpoint: Callable[..., Any],
    path: str,
) -> None:
    monkeypatch.setattr(module, "router", audited_router(module.router, endpoint))
    with pytest.raises(HotPathMismatch, match=rf"{re.escape(path)}: the hot path does not run \['audit'\]"):
        create_app(make_settings(api_hot_paths=True))
    create_app(make_settings(api_hot_paths=False))  # without the hot path there is nothing to mirror


def test_a_dependency_given_to_include_router_stops_the_app_too(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        jobs, "router", audited_router(jobs.router, submit_job, dependencies=[Depends(audit)])
    )
    with pytest.raises(HotPathMismatch, match=r"/v1/jobs: the hot path does not run \['audit'\]"):
        create_app(make_settings(api_hot_paths=True))


class Tagging:
    """A middleware someone might add to the app: it tags every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-tagged", b"yes")]
            await send(message)

        await self.app(scope, receive, tagged)


async def test_a_middleware_added_to_the_app_runs_for_the_hot_requests_too(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path is the innermost middleware: whatever the app adds runs before it decides."""
    monkeypatch.setattr("api.app.create_app", lambda settings: _tagged(create_app(settings)))
    async with api_client(make_settings(api_hot_paths=True)) as api:
        app = api._transport.app  # type: ignore[attr-defined]
        app.dependency_overrides[caller_owner] = _broken  # proof that the hot path answers
        submitted = await api.post("/v1/jobs", json={"prompt": "tagged"})
        assert submitted.status_code == 202 and submitted.headers["x-tagged"] == "yes"
        read = await api.get(submitted.headers["location"])
        assert read.status_code == 200 and read.headers["x-tagged"] == "yes"


def _tagged(app: Any) -> Any:
    app.add_middleware(Tagging)
    return app


def _broken() -> str:
    raise RuntimeError("FastAPI dependency reached")

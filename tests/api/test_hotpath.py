"""The raw-ASGI hot path (api/hotpath.py) answers exactly as the FastAPI routes do, and really
serves the requests it claims: every case below is sent to an app with it on and one with it off,
and the answers compared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import REGISTRY

from api.deps import current_owner
from shared.config import Settings
from tests.conftest import api_client, assert_nothing_written

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
]  # fmt: skip

#: Fields of a job that differ between two submissions of the same request.
PER_JOB = {"id", "created_at", "urls"}


def comparable(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    shape = {key: value for key, value in body.items() if key not in PER_JOB}  # an error keeps all
    headers = {name for name in response.headers if name not in ("date", "server", "content-length")}
    return {"status": response.status_code, "body": shape, "headers": sorted(headers)}


async def answers(settings: Settings, job_id: str | None = None) -> tuple[dict[str, Any], str]:
    results: dict[str, Any] = {}
    async with api_client(settings) as api:
        job_id = job_id or (await api.post("/v1/jobs", json={"prompt": "the job to read"})).json()["id"]
        for name, method, path, kwargs in CASES:
            response = await api.request(method, path.replace("{job}", job_id), **kwargs)
            results[name] = comparable(response)
    return results, job_id


async def test_hot_path_answers_like_the_fastapi_routes(make_settings: Callable[..., Settings]) -> None:
    hot, job_id = await answers(make_settings(api_hot_paths=True))
    routed, _ = await answers(make_settings(api_hot_paths=False), job_id)
    for name, *_ in CASES:
        assert hot[name] == routed[name], name
    assert hot["submit"]["status"] == 202 and "location" in hot["submit"]["headers"]
    assert hot["over the cap"]["body"]["error"]["param"] == "max_tokens"
    assert hot["malformed"]["status"] == 400
    assert hot["get unknown"]["status"] == 404


async def test_auth_and_rate_limits_hold_on_the_hot_path(make_settings, redis_client: redis.Redis) -> None:
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


async def test_requests_of_the_common_shape_skip_fastapi(make_settings) -> None:
    """With FastAPI's owner dependency broken, the FastAPI routes fail and the hot path does not:
    proof that the hot path, not the router, served them."""

    def broken() -> str:
        raise RuntimeError("FastAPI dependency reached")

    for hot_paths in (True, False):
        async with api_client(make_settings(api_hot_paths=hot_paths)) as api:
            app = api._transport.app  # type: ignore[attr-defined]
            app.dependency_overrides[current_owner] = broken
            try:
                submitted = await api.post("/v1/jobs", json={"prompt": f"skip fastapi {hot_paths}"})
            except RuntimeError:
                assert not hot_paths
                continue
            assert hot_paths and submitted.status_code == 202
            assert (await api.get(submitted.headers["location"])).status_code == 200
            long_poll = await api.get(submitted.headers["location"], params={"wait": "0.2"})
            assert long_poll.status_code == 200 and long_poll.json()["status"] == "queued"
            with pytest.raises(RuntimeError):  # anything else still goes through FastAPI
                await api.get("/v1/jobs")


async def test_hot_path_requests_are_counted_by_route_template(api) -> None:
    def served(route: str, method: str, status: str) -> float:
        labels = {"route": route, "method": method, "status": status}
        return REGISTRY.get_sample_value("genq_http_requests_total", labels) or 0.0

    before = served("/v1/jobs", "POST", "202"), served("/v1/jobs/{job_id}", "GET", "404")
    response = await api.post("/v1/jobs", json={"prompt": "counted"}, headers={"X-Request-ID": "req-42"})
    assert response.headers["x-request-id"] == "req-42"
    assert len((await api.get("/v1/jobs/missing")).headers["x-request-id"]) == 32
    after = served("/v1/jobs", "POST", "202"), served("/v1/jobs/{job_id}", "GET", "404")
    assert after == (before[0] + 1, before[1] + 1)

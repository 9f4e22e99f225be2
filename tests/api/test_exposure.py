"""What an API without keys refuses to browsers on other origins (a Host allowlist, JSON-only
POST bodies, on the raw-ASGI hot paths and FastAPI's routes alike), and a /metrics token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from shared.config import Settings
from tests.conftest import api_client, assert_nothing_written

pytestmark = pytest.mark.anyio

JOB = "6f1c0a2e-8b1d-4c3e-9f00-0123456789ab"


@pytest.mark.parametrize("hot_paths", [True, False])
@pytest.mark.parametrize(
    ("method", "path"), [("GET", f"/v1/jobs/{JOB}"), ("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/")]
)
async def test_an_anonymous_api_answers_only_its_allowed_host_names(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, hot_paths: bool, method: str, path: str
) -> None:
    async with api_client(make_settings(api_hot_paths=hot_paths)) as api:
        body: dict[str, Any] = {"json": {"prompt": "x"}} if method == "POST" else {}
        rebound = await api.request(method, path, headers={"host": "attacker.example:8000"}, **body)
        assert rebound.status_code == 403
        assert rebound.json()["error"] == {
            "type": "forbidden",
            "message": "this API serves without keys only under the names in GENQ_ALLOWED_HOSTS",
            "param": "Host",
        }
        assert_nothing_written(redis_client)
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
            served = await api.request(method, path, headers={"host": host}, **body)
            assert served.status_code in (200, 202, 404), served.text
        assert (await api.get("/healthz", headers={"host": "10.1.2.3:8000"})).status_code == 200  # probes


@pytest.mark.parametrize("hot_paths", [True, False])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_an_anonymous_api_takes_post_bodies_only_as_json(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    hot_paths: bool,
    content_type: str | None,
) -> None:
    async with api_client(make_settings(api_hot_paths=hot_paths)) as api:
        headers = {"content-type": content_type} if content_type else {}
        response = await api.post("/v1/jobs", content=b'{"prompt": "x"}', headers=headers)
        assert response.status_code == 415
        assert response.json()["error"]["param"] == "Content-Type"
        assert_nothing_written(redis_client)
        charset = {"content-type": "application/json; charset=utf-8"}
        assert (await api.post("/v1/jobs", content=b'{"prompt": "x"}', headers=charset)).status_code == 202


async def test_with_keys_every_host_name_is_served(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    async with api_client(make_settings(api_keys=["k1"]), api_key="k1") as api:
        response = await api.post("/v1/jobs", json={"prompt": "x"}, headers={"host": "genq.example.com"})
        assert response.status_code == 202


async def test_metrics_with_a_token_answer_only_to_it(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    async with api_client(make_settings(metrics_token="scrape-me")) as api:
        assert (await api.get("/metrics")).status_code == 401
        assert (await api.get("/metrics", headers={"authorization": "Bearer wrong"})).status_code == 401
        scraped = await api.get("/metrics", headers={"authorization": "Bearer scrape-me"})
        assert scraped.status_code == 200 and "genq_http_requests_total" in scraped.text


async def test_metrics_without_a_token_stay_open(api: httpx.AsyncClient) -> None:
    assert (await api.get("/metrics")).status_code == 200


async def test_an_anonymous_api_takes_an_upload_only_with_authorization(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """A cross-site form can post multipart/form-data but cannot add Authorization (preflight)."""
    async with api_client(make_settings()) as api:
        upload: dict[str, Any] = {"files": {"file": ("a.jsonl", b"{}\n")}, "data": {"purpose": "batch"}}
        refused = await api.post("/v1/files", **upload)
        assert refused.status_code == 415 and refused.json()["error"]["param"] == "Content-Type"
        assert_nothing_written(redis_client)
        taken = await api.post("/v1/files", headers={"authorization": "Bearer unused"}, **upload)
        assert taken.status_code == 200, taken.text

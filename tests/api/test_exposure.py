"""What an API without keys refuses to browsers on other origins (a Host allowlist, JSON-only
POST bodies, on the raw-ASGI hot paths and FastAPI's routes alike), and a /metrics token."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from shared.config import Settings, exposure_refusal
from tests.conftest import ROOT, api_client, assert_nothing_written, settings_env

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


async def test_metrics_without_a_token_stay_open_on_loopback(api: httpx.AsyncClient) -> None:
    assert (await api.get("/metrics")).status_code == 200


def genq_api_off_loopback(settings: Settings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "api", "--host", "0.0.0.0", "--port", "1"],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_genq_api_off_loopback_refuses_to_start_without_a_metrics_token(
    make_settings: Callable[..., Settings],
) -> None:
    """Like API keys: whoever reaches a non-loopback port would read every tenant's counters."""
    result = genq_api_off_loopback(make_settings(api_keys=["k1"]))
    assert result.returncode == 2
    assert "refusing to serve /metrics openly on 0.0.0.0: set GENQ_METRICS_TOKEN" in result.stderr


def test_exposure_checks_pass_with_keys_and_a_metrics_token(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(api_keys=["k1"], metrics_token="scrape-me")
    assert exposure_refusal(settings, "0.0.0.0") is None
    assert exposure_refusal(make_settings(), "127.0.0.1") is None  # loopback: neither is needed


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

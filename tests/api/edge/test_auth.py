"""API keys: required when configured, compared by digest; a key sees only its own jobs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
import redis

from shared.config import Settings
from tests.conftest import ROOT, api_client, settings_env

pytestmark = pytest.mark.anyio


async def test_keys_are_required_and_isolate_owners(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key", "bob-key"])
    async with api_client(settings) as anonymous:
        missing = await anonymous.post("/v1/jobs", json={"prompt": "x"})
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "unauthorized"
        assert missing.headers["www-authenticate"] == "Bearer"
    async with api_client(settings, "mallory-key") as mallory:
        assert (await mallory.get("/v1/jobs")).status_code == 401
    async with api_client(settings, "alice-key") as alice, api_client(settings, "bob-key") as bob:
        job = (await alice.post("/v1/jobs", json={"prompt": "alice's"})).json()
        assert (await alice.get(f"/v1/jobs/{job['id']}")).status_code == 200
        assert (await bob.get(f"/v1/jobs/{job['id']}")).status_code == 404
        assert (await bob.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 404
        assert (await bob.get("/v1/jobs")).json()["data"] == []
        assert [j["id"] for j in (await alice.get("/v1/jobs")).json()["data"]] == [job["id"]]
    assert redis_client.get("alice-key") is None
    assert not any("alice-key" in key for key in redis_client.keys("*"))


def test_anonymous_api_refuses_to_bind_beyond_loopback(make_settings: Callable[..., Settings]) -> None:
    env = settings_env(make_settings())
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "api", "--host", "0.0.0.0", "--port", "1"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "refusing to serve anonymously" in result.stderr

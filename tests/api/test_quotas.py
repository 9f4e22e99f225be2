"""Per-key bounds on what one key keeps in the shared store: past its bound a key gets 429
`quota_exceeded` naming the bound, nothing is written, and other keys go on as before."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = pytest.mark.anyio

ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}


async def test_live_job_bound_is_per_key(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(api_keys=["alice-key", "bob-key"], max_live_jobs_per_key=2)
    async with api_client(settings) as api:  # no worker: every accepted job stays queued
        for i in range(2):
            assert (await api.post("/v1/jobs", json={"prompt": f"a{i}"}, headers=ALICE)).status_code == 202
        refused = await api.post("/v1/jobs", json={"prompt": "a2"}, headers=ALICE)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["param"]) == ("quota_exceeded", "live_jobs")
        assert "GENQ_MAX_LIVE_JOBS_PER_KEY" in error["message"] and refused.headers["retry-after"]
        listed = (await api.get("/v1/jobs", headers=ALICE)).json()["data"]
        assert len(listed) == 2  # nothing written for the refused one
        bobs = await api.post("/v1/jobs", json={"prompt": "b"}, headers=BOB)
        assert bobs.status_code == 202
        # A canceled job no longer counts.
        await api.post(f"/v1/jobs/{listed[0]['id']}/cancel", headers=ALICE)
        assert (await api.post("/v1/jobs", json={"prompt": "a3"}, headers=ALICE)).status_code == 202
        start_worker(settings)  # B's job runs to the end as usual
        done = await api.get(f"/v1/jobs/{bobs.json()['id']}", params={"wait": 30}, headers=BOB)
        assert done.json()["status"] == "succeeded"


async def test_stored_bytes_bound_is_per_key(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key", "bob-key"], max_stored_bytes_per_key=20_000)
    async with api_client(settings) as api:
        big = {"prompt": "x" * 9_000}
        assert (await api.post("/v1/jobs", json=big, headers=ALICE)).status_code == 202
        assert (await api.post("/v1/jobs", json=big, headers=ALICE)).status_code == 202
        refused = await api.post("/v1/jobs", json=big, headers=ALICE)
        assert refused.status_code == 429 and refused.json()["error"]["param"] == "stored_bytes"
        assert (await api.post("/v1/jobs", json=big, headers=BOB)).status_code == 202


async def test_a_key_override_replaces_the_default_bound(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """GENQ_RATE_LIMIT_OVERRIDES sets one key's bounds (`live_jobs`, `stored_bytes`), as it does
    its rate limits: bob may hold 3 live jobs while alice keeps the default of 1."""
    from api.edge.auth import owner_of

    bob = owner_of("Bearer bob-key", make_settings(api_keys=["alice-key", "bob-key"]))
    settings = make_settings(api_keys=["alice-key", "bob-key"], max_live_jobs_per_key=1,
                             rate_limit_overrides={bob: {"live_jobs": "3"}})  # fmt: skip
    async with api_client(settings) as api:
        assert [(await api.post("/v1/jobs", json={"prompt": f"a{i}"}, headers=ALICE)).status_code
                for i in range(2)] == [202, 429]  # fmt: skip
        assert [(await api.post("/v1/jobs", json={"prompt": f"b{i}"}, headers=BOB)).status_code
                for i in range(4)] == [202, 202, 202, 429]  # fmt: skip


def test_an_override_that_is_not_a_whole_number_fails_at_start_up(
    make_settings: Callable[..., Settings],
) -> None:
    with pytest.raises(ValueError, match=r"\['key-x'\]\['live_jobs'\] must be a whole number"):
        make_settings(rate_limit_overrides={"key-x": {"live_jobs": "lots"}})

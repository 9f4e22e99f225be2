"""A job of n samples (or best_of) runs as many sequences, so it costs that many rows wherever
capacity is counted: the submit bucket and the per-key live-job bound; one job of n=1 costs one,
as before."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from shared import keys
from shared.config import Settings
from tests.conftest import api_client

pytestmark = pytest.mark.anyio

ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}


async def test_one_job_of_n_16_fills_a_16_row_live_bound(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key", "bob-key"], max_live_jobs_per_key=16)
    async with api_client(settings) as api:  # no worker: every accepted job stays queued
        wide = await api.post("/v1/jobs", json={"prompt": "a", "n": 16, "temperature": 1}, headers=ALICE)
        assert wide.status_code == 202, wide.text
        refused = await api.post("/v1/jobs", json={"prompt": "b"}, headers=ALICE)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["param"]) == ("quota_exceeded", "live_jobs")
        assert "GENQ_MAX_LIVE_JOBS_PER_KEY" in error["message"] and "rows" in error["message"]
        assert len((await api.get("/v1/jobs", headers=ALICE)).json()["data"]) == 1  # nothing written
        # best_of counts too, and a job past the bound on its own is refused for any key.
        ranked = await api.post("/v1/jobs", json={"prompt": "c", "best_of": 17}, headers=BOB)
        assert ranked.status_code == 422  # best_of is at most 16: the bound is the schema's
        bobs = await api.post("/v1/jobs", json={"prompt": "c", "n": 2, "best_of": 10}, headers=BOB)
        assert bobs.status_code == 202
        too_many = await api.post("/v1/jobs", json={"prompt": "d", "n": 7}, headers=BOB)
        assert too_many.status_code == 429 and too_many.json()["error"]["param"] == "live_jobs"
        assert (await api.post("/v1/jobs", json={"prompt": "d", "n": 6}, headers=BOB)).status_code == 202
        # Cancelling the wide job gives its 16 rows back.
        assert (await api.post(f"/v1/jobs/{wide.json()['id']}/cancel", headers=ALICE)).status_code == 200
        assert (await api.post("/v1/jobs", json={"prompt": "e", "n": 16}, headers=ALICE)).status_code == 202


async def test_sixteen_jobs_of_n_1_fill_a_16_row_live_bound_as_before(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key"], max_live_jobs_per_key=16)
    async with api_client(settings) as api:
        answers = [(await api.post("/v1/jobs", json={"prompt": f"a{i}"}, headers=ALICE)).status_code
                   for i in range(17)]  # fmt: skip
        assert answers == [202] * 16 + [429]
        live = redis_client.hgetall(keys.owner_live(_owner(settings, "alice-key")))
        assert live.pop(keys.OWNER_LIVE_TOTAL) == "16" and set(live.values()) == {"1"}


async def test_a_submission_takes_its_rows_from_the_submit_bucket(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key"], rate_limit_submit="20/0.001")
    async with api_client(settings) as api:
        first = await api.post("/v1/jobs", json={"prompt": "a", "n": 16, "temperature": 1}, headers=ALICE)
        assert first.status_code == 202, first.text
        assert 3.9 < _tokens_left(redis_client, settings) < 4.1  # 20 - 16
        refused = await api.post("/v1/jobs", json={"prompt": "b", "n": 5}, headers=ALICE)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limited"
        assert "4 tokens for this job's further samples" in refused.json()["error"]["message"]
        assert len(redis_client.keys("genq:job:*")) == 1
        # The OpenAI routes charge the same way: the refused submission above took its request's
        # token (3 left), this one takes 1 and then finds 2 for its 3 more rows.
        chat = {"messages": [{"role": "user", "content": "hi"}], "n": 4, "stream": True}
        answer = await api.post("/v1/chat/completions", json=chat, headers=ALICE)
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "rate_limit_exceeded"


async def test_a_job_of_more_rows_than_the_burst_passes_once_the_bucket_is_full(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """Its rows are counted at most at the burst: it empties the bucket, it is not refused for ever."""
    settings = make_settings(api_keys=["alice-key"], rate_limit_submit="4/0.001")
    async with api_client(settings) as api:
        first = await api.post("/v1/jobs", json={"prompt": "a", "n": 8, "temperature": 1}, headers=ALICE)
        assert first.status_code == 202, first.text
        assert _tokens_left(redis_client, settings) < 0.1
        again = await api.post("/v1/jobs", json={"prompt": "b"}, headers=ALICE)
        assert again.status_code == 429


def _tokens_left(client: redis.Redis, settings: Settings) -> float:
    """Tokens left in alice's submit bucket."""
    bucket = client.hget(keys.rate_limit(_owner(settings, "alice-key"), "submit"), "tokens")
    assert bucket is not None
    return float(bucket)


def _owner(settings: Settings, key: str) -> str:
    from api.edge.auth import owner_of

    return owner_of(f"Bearer {key}", settings)

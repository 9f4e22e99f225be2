"""Rate limits: exact 429 boundary with headers, refill, separate read and submit buckets,
per-key overrides, and one bucket shared by two API processes (real uvicorn servers)."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from shared.config import Settings
from tests.conftest import ROOT, ApiProcess, api_client, settings_env

pytestmark = pytest.mark.anyio


def owner_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


async def test_the_fifth_submission_of_a_four_token_bucket_is_refused(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["k1"], rate_limit_submit="4/0.5", rate_limit_read="1000/1000")
    async with api_client(settings, "k1") as api:
        answers = [await api.post("/v1/jobs", json={"prompt": "x"}) for _ in range(5)]
        assert [a.status_code for a in answers] == [202, 202, 202, 202, 429]
        assert [a.headers["x-ratelimit-remaining"] for a in answers[:4]] == ["3", "2", "1", "0"]
        refused = answers[4]
        assert refused.json()["error"]["type"] == "rate_limited"
        assert refused.headers["x-ratelimit-limit"] == "4"
        assert refused.headers["x-ratelimit-remaining"] == "0"
        assert refused.headers["retry-after"] == "2"  # one token at 0.5/s
        assert 0 < int(refused.headers["x-ratelimit-reset"]) <= 8
        assert len(redis_client.keys("genq:job:*")) == 4  # the refused one changed nothing
        # Reads have their own bucket: polling still works while submissions are limited.
        assert (await api.get("/v1/jobs")).status_code == 200
        await asyncio.sleep(2.1)
        assert (await api.post("/v1/jobs", json={"prompt": "x"})).status_code == 202  # refilled


async def test_per_key_overrides(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    settings = make_settings(
        api_keys=["small", "big"],
        rate_limit_submit="1/0.01",
        rate_limit_overrides={owner_id("big"): {"submit": "3/0.01"}},
    )
    async with api_client(settings, "small") as small, api_client(settings, "big") as big:
        assert [(await small.post("/v1/jobs", json={"prompt": "x"})).status_code for _ in range(2)] == [
            202,
            429,
        ]
        assert [(await big.post("/v1/jobs", json={"prompt": "x"})).status_code for _ in range(4)] == [
            202
        ] * 3 + [429]


def test_two_api_processes_share_one_bucket(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_api: Callable[[Settings], ApiProcess],
) -> None:
    settings = make_settings(api_keys=["shared"], rate_limit_submit="6/0.01")
    apis = [start_api(settings), start_api(settings)]
    clients = [httpx.Client(base_url=api.url, headers={"Authorization": "Bearer shared"}) for api in apis]
    statuses = [clients[i % 2].post("/v1/jobs", json={"prompt": f"x{i}"}).status_code for i in range(8)]
    assert statuses == [202] * 6 + [429, 429]


async def test_redis_down_fails_reads_open_and_submissions_closed(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    from api.edge.ratelimit import RateLimiter
    from cli.redis_server import EmbeddedRedis
    from shared.errors import Unavailable

    server = EmbeddedRedis(tmp_path / "down")
    server.start()
    settings = make_settings(redis_url=server.url, rate_limit_submit="5/1", rate_limit_read="5/1")
    from api.redis_io.batching import BatchedCommands
    from api.redis_io.client import redis_client as make_client

    client = make_client(settings)
    limiter = RateLimiter(client, BatchedCommands(client), settings)
    assert (await limiter.check("someone", "read"))["X-RateLimit-Remaining"] == "4"
    server.stop()
    assert await limiter.check("someone", "read") == {}
    with pytest.raises(Unavailable):
        await limiter.check("someone", "submit")
    await client.aclose()


@pytest.mark.parametrize("name", ["GENQ_RATE_LIMIT_SUBMIT", "GENQ_RATE_LIMIT_READ"])
def test_a_limit_that_does_not_parse_stops_the_api_at_start_up(
    make_settings: Callable[..., Settings], name: str
) -> None:
    """Not a 500 on every request that reaches the limiter: `genq api` refuses to start, naming
    the setting (and never its value)."""
    env = settings_env(make_settings()) | {name: "60per10"}
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "api", "--port", "1"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"{name} must be `capacity/refill per second`" in result.stderr
    assert "60per10" not in result.stderr


async def test_an_upload_and_a_batch_take_the_tokens_their_settings_say(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(
        api_keys=["k1"], rate_limit_submit="12/0.01", rate_limit_upload_tokens=5, rate_limit_batch_tokens=4
    )
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}\n'
    batch = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with api_client(settings, "k1") as api:

        async def upload() -> httpx.Response:
            return await api.post("/v1/files", files={"file": ("in.jsonl", line)}, data={"purpose": "batch"})

        uploaded = await upload()  # 5 of 12 tokens
        assert uploaded.status_code == 200, uploaded.text
        created = await api.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], **batch})
        assert created.status_code == 200, created.text  # 4 more: 3 left
        refused = await upload()
        assert refused.status_code == 429, refused.text
        assert "5 tokens for each upload" in refused.json()["error"]["message"]
        assert "retry-after" in refused.headers
        assert (await api.post("/v1/jobs", json={"prompt": "x"})).status_code == 202  # a job takes 1
        again = await api.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], **batch})
        assert again.status_code == 429 and "4 tokens for each batch" in again.json()["error"]["message"]

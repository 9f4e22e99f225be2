"""A filtered list reads bounded bytes from Redis: candidates' heads first (status and field
sizes), then only the summaries of the page's matches, within GENQ_LIST_MAX_BYTES; measured on the
real server as the delta of INFO's total_net_output_bytes."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import redis

from shared.config import Settings
from tests.conftest import api_client

pytestmark = pytest.mark.anyio

#: ~37 KB of metadata: 16 values of 512 four-byte characters under 64-character keys.
BIG_METADATA = {f"{i:02d}" + "k" * 62: "\U0001f600" * 512 for i in range(16)}


def _bytes_sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


async def _submit_many(api: httpx.AsyncClient, count: int) -> list[str]:
    ids = []
    for i in range(count):
        answer = await api.post("/v1/jobs", json={"prompt": f"p{i}", "metadata": BIG_METADATA})
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["id"])
    return ids


async def test_a_status_filter_reads_bounded_bytes(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["k"], max_stored_bytes_per_key=0, list_max_bytes=1 << 20)
    async with api_client(settings, "k") as api:
        ids = await _submit_many(api, 300)  # no worker: all stay queued
        queued = set(ids[::30])  # 10 stay queued, the rest are canceled
        for job_id in set(ids) - queued:
            assert (await api.post(f"/v1/jobs/{job_id}/cancel")).status_code == 200
        before = _bytes_sent(redis_client)
        page = await api.get("/v1/jobs", params={"status": "queued", "limit": 100})
        read = _bytes_sent(redis_client) - before
        assert page.status_code == 200
        body = page.json()
        assert [job["id"] for job in body["data"]] == [i for i in reversed(ids) if i in queued]
        assert body["next_cursor"] is None
        # The ten summaries (~37 KB each) and 300 heads; reading every candidate's summary was 11 MB.
        assert read < 600_000, read
        before = _bytes_sent(redis_client)
        empty = await api.get("/v1/jobs", params={"status": "running", "limit": 100})
        assert empty.json()["data"] == [] and _bytes_sent(redis_client) - before < 100_000


async def test_a_page_ends_at_its_byte_budget_and_the_cursor_goes_on(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["k"], max_stored_bytes_per_key=0, list_max_bytes=100_000)
    async with api_client(settings, "k") as api:
        ids = await _submit_many(api, 8)
        seen: list[str] = []
        cursor = None
        for _ in range(8):
            before = _bytes_sent(redis_client)
            params: dict[str, str | int] = {"status": "queued", "limit": 100}
            if cursor:
                params["cursor"] = cursor
            body = (await api.get("/v1/jobs", params=params)).json()
            assert _bytes_sent(redis_client) - before < 150_000  # the budget, plus the heads
            assert 1 <= len(body["data"]) <= 2
            seen += [job["id"] for job in body["data"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == list(reversed(ids))

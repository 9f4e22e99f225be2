"""A burst ten times over the rate limit, against a real `genq api` process: every answer is a
success or a 429 (never a 5xx), and the process's memory stays flat from one burst to the next."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from shared.config import Settings
from tests.conftest import ApiProcess

pytestmark = pytest.mark.slow


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def burst(url: str, count: int) -> Counter[int]:
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        semaphore = asyncio.Semaphore(50)

        async def one(i: int) -> int:
            async with semaphore:
                response = await client.post("/v1/jobs", json={"prompt": f"burst {i}", "max_tokens": 1})
                return response.status_code

        return Counter(await asyncio.gather(*(one(i) for i in range(count))))


def test_a_burst_ten_times_over_the_limit_gets_only_202_and_429(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_api: Callable[[Settings], ApiProcess],
) -> None:
    # A bucket of 50 refilled at 5/s; each burst sends 1,000 as fast as it can (a few seconds here).
    api = start_api(make_settings(rate_limit_submit="50/5", max_queue_length=0))
    first = asyncio.run(burst(api.url, 1000))
    after_first = rss_kib(api.process.pid)
    second = asyncio.run(burst(api.url, 1000))
    after_second = rss_kib(api.process.pid)
    for counts in (first, second):
        assert set(counts) <= {202, 429}, counts
        assert counts[202] >= 20 and counts[429] >= 500, counts  # the limit held and still served
    assert after_second - after_first < 20 * 1024, (after_first, after_second)

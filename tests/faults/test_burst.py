"""A burst ten times over the rate limit, against a real `genq api` process: every answer is a
success or a 429 (never a 5xx), and the process's memory stays flat from one burst to the next."""

from __future__ import annotations

import asyncio
import time
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
    """A bucket of 50 refilled at 5/s; each burst sends 1,000 as fast as it can. Each is served
    what the bucket holds when it starts plus what refills while it runs, and no more: the first
    starts full, the second after a 2 s pause (10 tokens)."""
    api = start_api(make_settings(rate_limit_submit="50/5", max_queue_length=0))
    first, first_s = timed_burst(api.url, 1000)
    after_first = rss_kib(api.process.pid)
    time.sleep(2.0)
    second, second_s = timed_burst(api.url, 1000)
    after_second = rss_kib(api.process.pid)
    for counts, held, took_s in ((first, 50, first_s), (second, 10, second_s)):
        assert set(counts) <= {202, 429}, counts
        # Served what the bucket held (less a token for timing at the edges), and no more than
        # that and its refill while the burst ran: the limit held and still served.
        assert held - 1 <= counts[202] <= held + 5 * took_s + 2, (counts, took_s)
    assert after_second - after_first < 20 * 1024, (after_first, after_second)


def timed_burst(url: str, count: int) -> tuple[Counter[int], float]:
    started = time.monotonic()
    counts = asyncio.run(burst(url, count))
    return counts, time.monotonic() - started

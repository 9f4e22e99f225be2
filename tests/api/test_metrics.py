"""Metrics move as operators expect: the queue length counts every accepted, not-running job
wherever its message sits (including messages a worker reserved but has not started), falls as a
worker drains the queue; batch histograms count engine steps; route labels are templates."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from shared.config import Settings
from tests.conftest import WorkerProcess, api_client, wait_until_running

pytestmark = pytest.mark.anyio
QUEUE = "genq.placeholder-echo"


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def queue_length(api: httpx.AsyncClient) -> float:
    await asyncio.sleep(1.05)  # the statistics are cached for a second
    text = (await api.get("/metrics")).text
    return samples(text, "genq_queue_length")[(("queue", QUEUE),)]


async def test_queue_length_counts_waiting_and_reserved_jobs(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(placeholder_step_s=0.05, worker_prefetch_multiplier=4, max_batch_size=1)
    async with api_client(settings) as api:
        assert await queue_length(api) == 0
        ids = [
            (await api.post("/v1/jobs", json={"prompt": f"j{i}", "max_tokens": 40})).json()["id"]
            for i in range(8)
        ]
        assert await queue_length(api) == 8
        start_worker(settings, "--concurrency=1")
        await wait_until_running(redis_client, ids[:1])
        await asyncio.sleep(0.3)
        waiting = sum(
            redis_client.llen(k)
            for k in (QUEUE, QUEUE + "\x06\x163", QUEUE + "\x06\x166", QUEUE + "\x06\x169")
        )
        # The worker reserved 4 messages and runs 1: LLEN misses the 3 it holds, the metric does not.
        assert waiting == 4
        assert redis_client.hlen("unacked") == 4
        assert await queue_length(api) == 7
        text = (await api.get("/metrics")).text
        assert samples(text, "genq_jobs_running")[(("queue", QUEUE),)] == 1
        assert samples(text, "genq_queue_unacked")[()] == 4
        for job_id in ids:
            assert (await api.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()["status"] == "succeeded"
        assert await queue_length(api) == 0


async def test_http_metrics_use_route_templates(api: httpx.AsyncClient) -> None:
    await api.get("/v1/jobs/abc")
    await api.get("/v1/jobs/def")
    text = (await api.get("/metrics")).text
    requests = samples(text, "genq_http_requests_total")
    key = (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "404"))
    assert requests[key] >= 2
    assert not any("abc" in str(labels) for labels in requests)
    assert samples(text, "genq_gateway_requests_inflight")[()] >= 1  # this scrape itself


def test_worker_exports_batch_and_token_metrics(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    from cli.redis_server import free_port

    port = free_port()
    settings = make_settings(worker_metrics_port=port)
    start_worker(settings)

    async def run_jobs() -> None:
        async with api_client(settings) as api:
            ids = [
                (await api.post("/v1/jobs", json={"prompt": f"a {i}", "max_tokens": 5})).json()["id"]
                for i in range(4)
            ]
            for job_id in ids:
                await api.get(f"/v1/jobs/{job_id}", params={"wait": 20})

    asyncio.run(run_jobs())
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert samples(text, "genq_worker_ready")[(("queue", QUEUE),)] == 1
    model = (("model", "placeholder-echo"),)
    assert samples(text, "genq_generated_tokens_total")[model] >= 20
    assert samples(text, "genq_prompt_tokens_total")[model] >= 8  # "a", "i": 2 words each
    assert samples(text, "genq_prompt_tokens_cached_total")[model] == 0  # no prefix cache here
    # A job's first token comes from its prefill, its other four from decode steps, one row each:
    # four steps when the four jobs ran together (more when they came apart), 16 rows in all.
    assert samples(text, "genq_batch_size_distribution_count")[model] >= 4
    assert samples(text, "genq_batch_size_distribution_sum")[model] == 16
    assert samples(text, "genq_jobs_total")[(("status", "succeeded"),)] == 4
    assert samples(text, "genq_model_inference_duration_seconds_count")[model] == 4
    assert samples(text, "genq_queue_wait_seconds_count")[(("queue", QUEUE),)] == 4


async def _usages(settings: Settings, *contents: str) -> list[dict[str, int]]:
    """Chat requests with these contents, one after the other: the usage of each."""
    async with api_client(settings) as api:
        usages = []
        for content in contents:
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3, "cache": False}
            job = (await api.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"})).json()
            usages.append(job["output"]["usage"])
        return usages


def _scrape_until(port: int, labels: tuple[tuple[str, str], ...], expected: dict[str, float]) -> str:
    """The worker's metrics once each named sample has its expected value (a step's metrics follow
    its job's result by a moment), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        settled = all(samples(text, name).get(labels) == value for name, value in expected.items())
        if settled or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


@pytest.mark.slow
def test_a_default_model_worker_exports_what_its_prefix_cache_saves_and_drops(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """The same chat request twice: the second prefills only its last token, the cells the first
    left (a share operators read as the cache's hit rate; the job's usage says it too). Then a
    prompt longer than the cache's bound: the older cells are dropped and counted, and what the
    cache keeps stays within it."""
    from cli.redis_server import free_port

    port, model = free_port(), (("model", "smollm2-135m-instruct"),)
    settings = make_settings(
        model="smollm2-135m-instruct", worker_metrics_port=port, llamacpp_cache_tokens=80
    )
    start_worker(settings)
    usages = asyncio.run(_usages(settings, "Name a color.", "Name a color."))
    prompts = [usage["prompt_tokens"] for usage in usages]
    assert [usage["cached_prompt_tokens"] for usage in usages] == [0, prompts[1] - 1]
    text = _scrape_until(port, model, {"genq_prompt_tokens_total": sum(prompts)})
    assert samples(text, "genq_prompt_tokens_cached_total")[model] == prompts[1] - 1  # all but its last
    assert samples(text, "genq_prefix_cache_evictions_total")[model] == 0
    assert prompts[1] <= samples(text, "genq_prefix_cache_tokens")[model] <= 80

    (long,) = asyncio.run(_usages(settings, "Count: " + " ".join(map(str, range(40)))))
    prompts.append(long["prompt_tokens"])
    assert prompts[2] > 80
    text = _scrape_until(port, model, {"genq_prompt_tokens_total": sum(prompts)})
    shared = samples(text, "genq_prompt_tokens_cached_total")[model] - (prompts[1] - 1)
    assert shared == long["cached_prompt_tokens"] < prompts[0]  # the chat template's head, at most
    assert samples(text, "genq_prefix_cache_evictions_total")[model] >= 1
    assert samples(text, "genq_prefix_cache_tokens")[model] <= 80


async def test_redis_memory_and_the_webhook_backlog_are_exported(
    api: httpx.AsyncClient, redis_client: redis.Redis
) -> None:
    """What the Redis-memory alert and the webhook-backlog panel read, without redis_exporter."""
    redis_client.config_set("maxmemory", str(512 * 2**20))
    try:
        await asyncio.sleep(1.05)  # the statistics are cached for a second
        text = (await api.get("/metrics")).text
    finally:
        redis_client.config_set("maxmemory", "0")
    used = samples(text, "genq_redis_memory_used_bytes")[()]
    assert 0 < used == pytest.approx(int(redis_client.info("memory")["used_memory"]), rel=0.5)
    assert samples(text, "genq_redis_memory_max_bytes")[()] == 512 * 2**20
    assert samples(text, "genq_queue_length")[(("queue", "webhooks"),)] == 0

"""Scale benchmark: does a job cost the same with a long queue, and what do long-pollers cost?

    python -m bench.scale            # queues of 1k, 10k, 100k jobs; 1,000 long-pollers (~2-3 minutes)
    python -m bench.scale --quick    # queues of 100 and 1k; 50 long-pollers: a smoke test

A real `genq api` process and its own Redis, no worker, so every job stays queued. The queue is
filled through the API's own submit path (JobQueue.submit in this process: the same job-store
script the API runs, without HTTP in the way), up to each level; there the API's `POST /v1/jobs`
and `GET /v1/jobs/{id}` latency is measured (open loop, a modest rate) and Redis's used_memory
growth per queued job (INFO memory, against the empty server). Then, with the longest queue,
`GET ?wait=30` long-polls on queued jobs are held open while the API's CPU and RSS are sampled,
idle and under the same open-loop load, against the same windows without pollers.
Writes <out>/scale.json and <out>/scale.png.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from api.app import create_app
from api.edge.auth import ANONYMOUS
from bench.common import (
    BENCH_SETTINGS,
    bench_stack,
    cpu_seconds,
    latency_summary,
    machine,
    parse_args,
    print_table,
    process_tree,
    ratio,
    rss_mb,
    run_async,
    start_api,
    start_redis,
    write_report,
)
from bench.loadgen import LoadResult, Pool, http_request, json_post, open_loop
from shared import keys
from shared.config import Settings
from shared.schemas import JobCreate

MODEL = "placeholder-echo"
POLL_WAIT_S = 30
JOB_BODY = orjson.dumps({"prompt": "Name three rivers.", "max_tokens": 8, "cache": False})


@dataclass(frozen=True)
class Sizes:
    levels: tuple[int, ...]
    #: Requests per latency probe, sent at probe_rate per second.
    probe_requests: int
    probe_rate: float
    pollers: int
    #: Seconds of each CPU/latency window in the polling part.
    window_s: float


FULL = Sizes((1000, 10_000, 100_000), 500, 100.0, 1000, 5.0)
QUICK = Sizes((100, 1000), 100, 100.0, 50, 1.0)
FILL_CONCURRENCY = 128


# --- Filling the queue --------------------------------------------------------------------------


async def fill(queue: Any, count: int) -> list[str]:
    """Submit `count` jobs through JobQueue.submit (the API's path), FILL_CONCURRENCY at a time."""
    ids: list[str] = []

    async def submit(index: int) -> None:
        create = JobCreate(prompt=f"Fill {index}: name three rivers.", max_tokens=8, cache=False)
        accepted = await queue.submit(create, ANONYMOUS, None)
        ids.append(accepted.job["id"])

    for start in range(0, count, FILL_CONCURRENCY):
        await asyncio.gather(*(submit(i) for i in range(start, min(count, start + FILL_CONCURRENCY))))
    return ids


async def used_memory(client: aioredis.Redis) -> int:
    info = await client.info("memory")
    return int(info["used_memory"])


async def queue_length(client: aioredis.Redis) -> int:
    return int(await client.llen(keys.queue_key(keys.queue_for_model(MODEL), 0)))


# --- Probes -------------------------------------------------------------------------------------


def summarize(result: LoadResult, prefix: str) -> dict[str, Any]:
    latencies = result.latencies_ms()
    return {f"{prefix}_rate": round(result.rate(), 1), f"{prefix}_errors": result.completed - len(latencies)
            + result.unfinished, **latency_summary(latencies, f"{prefix}_")}  # fmt: skip


async def probe(
    port: int, job_ids: Sequence[str], sizes: Sizes, duration_s: float | None = None
) -> dict[str, Any]:
    """POST and GET latency, open loop, both at probe_rate at once (for duration_s, if given)."""
    count = sizes.probe_requests if duration_s is None else round(sizes.probe_rate * duration_s)
    posts = [json_post("/v1/jobs", JOB_BODY)] * count
    gets = [http_request("GET", f"/v1/jobs/{job_id}") for job_id in random.choices(job_ids, k=count)]
    post_result, get_result = await asyncio.gather(
        open_loop("127.0.0.1", port, posts, sizes.probe_rate, 16),
        open_loop("127.0.0.1", port, gets, sizes.probe_rate, 16),
    )
    return {**summarize(post_result, "post"), **summarize(get_result, "get")}


async def measure_level(
    level: int, port: int, queue: Any, client: aioredis.Redis, job_ids: list[str], baseline: int, sizes: Sizes
) -> dict[str, Any]:
    started = time.perf_counter()
    job_ids += await fill(queue, max(0, level - await queue_length(client)))
    fill_s = time.perf_counter() - started
    queued = await queue_length(client)
    memory = await used_memory(client) - baseline
    record = await client.memory_usage(keys.job(job_ids[-1]))
    result = {"level": level, "queued": queued,
              "fill_jobs_per_s": round(level / fill_s, 1) if fill_s else None,
              "used_memory_delta_mb": round(memory / 2**20, 2),
              "bytes_per_queued_job": round(memory / queued), "job_record_bytes": record,
              **await probe(port, job_ids, sizes)}  # fmt: skip
    print(f"  {queued:,} queued: {result['bytes_per_queued_job']:,} B/job, POST p50/p99 "
          f"{result['post_p50_ms']}/{result['post_p99_ms']} ms, GET p50/p99 {result['get_p50_ms']}/"
          f"{result['get_p99_ms']} ms")  # fmt: skip
    return result


# --- Long-pollers -------------------------------------------------------------------------------


async def window(
    pids: list[int], port: int, job_ids: Sequence[str], sizes: Sizes, load: bool
) -> dict[str, Any]:
    """The API's CPU (% of one core) and RSS over one window, idle or under the probe load."""
    cpu_before, began = cpu_seconds(pids), time.perf_counter()
    latencies = await probe(port, job_ids, sizes, sizes.window_s) if load else {}
    if not load:
        await asyncio.sleep(sizes.window_s)
    elapsed = time.perf_counter() - began
    return {"api_cpu_percent": round((cpu_seconds(pids) - cpu_before) / elapsed * 100, 1),
            "api_rss_mb": round(rss_mb(pids), 1), **latencies}  # fmt: skip


async def measure_pollers(api_pid: int, port: int, job_ids: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Windows without pollers, then the same with `sizes.pollers` long-polls held open."""
    pids = process_tree(api_pid)
    polled, others = job_ids[: sizes.pollers], job_ids[sizes.pollers :]
    phases = {"idle": await window(pids, port, others, sizes, load=False),
              "load": await window(pids, port, others, sizes, load=True)}  # fmt: skip
    async with Pool("127.0.0.1", port, sizes.pollers) as held:
        for job_id in polled:
            held.submit(http_request("GET", f"/v1/jobs/{job_id}?wait={POLL_WAIT_S}"))
        await asyncio.sleep(1.0)  # the API takes them all in
        phases["idle_with_pollers"] = await window(pids, port, others, sizes, load=False)
        phases["load_with_pollers"] = await window(pids, port, others, sizes, load=True)
        answered_early = held.result.completed
    per_poller = (
        phases["idle_with_pollers"]["api_cpu_percent"] - phases["idle"]["api_cpu_percent"]
    ) / sizes.pollers
    return {"pollers": sizes.pollers, "answered_before_their_wait": answered_early, "phases": phases,
            "cpu_percent_per_1000_pollers": round(per_poller * 1000, 1),
            "load_p99_ratio_with_pollers": {
                kind: ratio(phases["load_with_pollers"][f"{kind}_p99_ms"], phases["load"][f"{kind}_p99_ms"])
                for kind in ("post", "get")}}  # fmt: skip


# --- The run ------------------------------------------------------------------------------------


async def measure(
    redis_url: str, api_pid: int, port: int, settings: dict[str, str], sizes: Sizes
) -> dict[str, Any]:
    values: dict[str, Any] = {name.lower(): value for name, value in settings.items()}
    app = create_app(Settings(_env_file=None, **values))
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with app.router.lifespan_context(app):
            baseline = await used_memory(client)
            job_ids: list[str] = []
            levels = [await measure_level(level, port, app.state.queue, client, job_ids, baseline, sizes)
                      for level in sizes.levels]  # fmt: skip
            print(f"  {sizes.pollers} long-pollers ...")
            pollers = await measure_pollers(api_pid, port, job_ids, sizes)
    finally:
        await client.aclose()
    return {"levels": levels, "polling": pollers}


def print_tables(report: dict[str, Any]) -> None:
    rows = [[level["queued"], level["bytes_per_queued_job"], level["job_record_bytes"], level["post_p50_ms"],
             level["post_p99_ms"], level["get_p50_ms"], level["get_p99_ms"],
             level["post_errors"] + level["get_errors"]] for level in report["levels"]]  # fmt: skip
    print_table("Queue length: Redis memory and API latency (open loop, "
                f"{report['sizes']['probe_rate']:g}/s each)", ["queued jobs", "bytes/job", "record bytes",
                "POST p50", "POST p99", "GET p50", "GET p99", "errors"], rows)  # fmt: skip
    polling = report["polling"]
    rows = [[phase, values["api_cpu_percent"], values["api_rss_mb"], values.get("post_p99_ms"),
             values.get("get_p99_ms")] for phase, values in polling["phases"].items()]  # fmt: skip
    print_table(f"{polling['pollers']} long-pollers (GET ?wait={POLL_WAIT_S})",
                ["phase", "API CPU %", "API RSS MB", "POST p99 ms", "GET p99 ms"], rows)  # fmt: skip
    print(f"API CPU per 1,000 idle pollers: {polling['cpu_percent_per_1000_pollers']} % of a core; "
          f"p99 with/without pollers: {polling['load_p99_ratio_with_pollers']}")  # fmt: skip


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    levels = report["levels"]
    queued = [level["queued"] for level in levels]
    figure, (memory, latency, polling) = plt.subplots(1, 3, figsize=(15, 4.2))
    memory.plot(queued, [level["bytes_per_queued_job"] for level in levels], "o-")
    memory.set(
        xscale="log",
        xlabel="queued jobs",
        ylabel="bytes",
        title="Redis memory per queued job",
        ylim=(0, None),
    )
    for key, style in (("post", "o-"), ("get", "s-")):
        for q in ("p50", "p99"):
            latency.plot(
                queued, [level[f"{key}_{q}_ms"] for level in levels], style, label=f"{key.upper()} {q}"
            )
    latency.set(xscale="log", xlabel="queued jobs", ylabel="ms", title="API latency vs queue length")
    latency.legend()
    phases = report["polling"]["phases"]
    polling.bar(list(phases), [values["api_cpu_percent"] for values in phases.values()])
    polling.set(ylabel="API CPU % of a core", title=f"{report['polling']['pollers']} long-pollers")
    polling.tick_params(axis="x", labelrotation=15)
    figure.suptitle(f"genq API + Redis, no worker, {report['machine']['cpus']} CPUs (shared, noisy)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "scale", argv)
    sizes = QUICK if args.quick else FULL
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "sizes": sizes.__dict__}
    with bench_stack("scale") as (stack, scratch):
        redis = start_redis(stack, scratch / "redis")
        settings = {
            **BENCH_SETTINGS,
            "REDIS_URL": redis.url,
            "DATA_DIR": str(scratch / "genq"),
            "MODEL": MODEL,
        }
        api, port = start_api(stack, "api", settings, scratch)
        report.update(run_async(measure(redis.url, api.process.pid, port, settings, sizes)))
    print_tables(report)
    write_report(args.out, "scale", report, plot)
    return report


if __name__ == "__main__":
    main()

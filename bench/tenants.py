"""Hostile tenant: what key A's held streams cost one API process, and what key B notices.

    python -m bench.tenants            # A holds 10,000 idle streams and 100 long-polls (~1-2 minutes)
    python -m bench.tenants --quick    # 200 streams: a smoke test

A real `genq api` process (one uvicorn process), its own Redis and a real worker for B's jobs. A's
HELD_JOBS jobs are queued for a model no worker serves, so they never end (streams are spread over
them): every stream and long-poll on it stays open and idle, as a misbehaving client's would. A's
limits are raised to exactly what it opens (GENQ_RATE_LIMIT_OVERRIDES), so one more of each answers
429. Measured with A idle, then with A holding them: the API's RSS, its CPU while idle, Redis's
connected clients (the API's pooled connections plus the stream hub's subscription), and B's
latency: `GET /v1/jobs/{id}` p50/p99 at a steady rate, and submit -> finished for small jobs;
`/readyz` must stay 200.
Writes <out>/tenants.json and <out>/tenants.png.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import redis.asyncio as aioredis

from bench.common import (
    BENCH_SETTINGS,
    bench_stack,
    cpu_seconds,
    latency_summary,
    machine,
    parse_args,
    print_table,
    process_tree,
    rss_mb,
    run_async,
    start_api,
    start_redis,
    start_worker,
    write_report,
)

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
IDLE_MODEL = "nobody-serves-this"
LONG_POLLS = 100
HELD_JOBS = 100
READS = 300
READ_INTERVAL_S = 0.01
FINISHES = 20


def owner_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def tenant_settings(redis_url: str, data_dir: str, streams: int) -> dict[str, str]:
    overrides = {owner_of(KEY_A): {"streams": str(streams), "long_polls": str(LONG_POLLS)}}
    return {
        **BENCH_SETTINGS,
        "REDIS_URL": redis_url,
        "DATA_DIR": data_dir,
        "MODEL": "placeholder-echo",
        "MODELS": IDLE_MODEL,
        "API_KEYS": f"{KEY_A},{KEY_B}",
        "RATE_LIMIT_OVERRIDES": json.dumps(overrides),
        "API_LIMIT_CONCURRENCY": str(streams + LONG_POLLS + 1000),
        "PLACEHOLDER_STEP_S": "0",
        "MAX_WAIT_S": "300",
    }


async def open_stream(
    port: int, job_id: str, key: str = KEY_A
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw SSE request of A's (10,000 httpx clients would cost this process more than the API):
    returned once the 200 and its headers arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/jobs/{job_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"a stream was refused: {head[:200]!r}")
    return reader, writer


async def b_latency(b: httpx.AsyncClient, reads_n: int = READS, finishes_n: int = FINISHES) -> dict[str, Any]:
    """B's GET of its own job at a steady rate, and B's small jobs from submit to finished."""
    job_id = (await b.post("/v1/jobs", json={"prompt": "b", "max_tokens": 2})).json()["id"]
    reads: list[float] = []
    for _ in range(reads_n):
        started = time.perf_counter()
        assert (await b.get(f"/v1/jobs/{job_id}")).status_code == 200
        reads.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(READ_INTERVAL_S)
    finishes: list[float] = []
    for i in range(finishes_n):
        started = time.perf_counter()
        submitted = await b.post("/v1/jobs", json={"prompt": f"b{i}", "max_tokens": 2, "cache": False})
        done = await b.get(f"/v1/jobs/{submitted.json()['id']}", params={"wait": 30})
        assert done.json()["status"] == "succeeded", done.text
        finishes.append((time.perf_counter() - started) * 1000)
    ready = await b.get("/readyz")
    return {
        **latency_summary(reads, "get_"),
        **latency_summary(finishes, "finish_"),
        "readyz": ready.status_code,
    }


async def api_state(api_pid: int, client: aioredis.Redis) -> dict[str, float]:
    pids = process_tree(api_pid)
    cpu_before = cpu_seconds(pids)
    await asyncio.sleep(5.0)
    info = await client.info("clients")
    return {
        "rss_mb": round(rss_mb(pids), 1),
        "idle_cpu_percent": round((cpu_seconds(pids) - cpu_before) / 5.0 * 100, 1),
        "redis_clients": float(info["connected_clients"]),
    }


async def one_too_many(a: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    stream = await a.get(f"/v1/jobs/{job_id}/stream")
    poll = await a.get(f"/v1/jobs/{job_id}", params={"wait": 1})
    return {"stream": stream.status_code, "stream_error": stream.json()["error"],
            "long_poll": poll.status_code, "long_poll_error": poll.json()["error"]}  # fmt: skip


async def measure(api_pid: int, port: int, redis_url: str, streams: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=LONG_POLLS + 20)
    client = aioredis.Redis.from_url(redis_url)
    as_a = {"Authorization": f"Bearer {KEY_A}"}
    async with (
        httpx.AsyncClient(base_url=base, headers=as_a, timeout=60, limits=limits) as a,
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY_B}"}, timeout=60) as b,
    ):
        jobs = [(await a.post("/v1/jobs", json={"prompt": "a", "model": IDLE_MODEL})).json()["id"]
                for _ in range(HELD_JOBS)]  # fmt: skip
        held_job = jobs[0]
        await b_latency(b)  # warm-up: first requests pay imports and connection set-up
        quiet = {**await api_state(api_pid, client), **await b_latency(b)}
        started = time.perf_counter()
        held = [await open_stream(port, jobs[i % HELD_JOBS]) for i in range(streams)]
        opened_s = time.perf_counter() - started
        polls = [
            asyncio.create_task(a.get(f"/v1/jobs/{held_job}", params={"wait": 240}))
            for _ in range(LONG_POLLS)
        ]
        await asyncio.sleep(2.0)  # every long-poll is in
        busy = {**await api_state(api_pid, client), **await b_latency(b)}
        refused = await one_too_many(a, held_job)
        for task in polls:
            task.cancel()
        for _, writer in held:
            writer.close()
    await client.aclose()
    per_stream_kb = (busy["rss_mb"] - quiet["rss_mb"]) * 1024 / streams
    return {"streams": streams, "long_polls": LONG_POLLS, "open_s": round(opened_s, 1), "quiet": quiet,
            "busy": busy, "rss_per_stream_kb": round(per_stream_kb, 1), "one_too_many": refused}  # fmt: skip


def print_tables(report: dict[str, Any]) -> None:
    columns = ["", "API RSS MB", "idle CPU %", "Redis clients", "B GET p50", "B GET p99", "B job p50",
               "B job p99", "/readyz"]  # fmt: skip
    rows = [
        [label, s["rss_mb"], s["idle_cpu_percent"], s["redis_clients"], s["get_p50_ms"], s["get_p99_ms"],
         s["finish_p50_ms"], s["finish_p99_ms"], s["readyz"]]
        for label, s in (("A idle", report["quiet"]), (f"A holds {report['streams']:,}", report["busy"]))
    ]  # fmt: skip
    print_table("Key A's held streams and long-polls, key B's latency (ms)", columns, rows)
    print(f"RSS per held stream: {report['rss_per_stream_kb']} KB; one too many: {report['one_too_many']}")


def plot(report: dict[str, Any], path: Any) -> None:
    import matplotlib.pyplot as plt

    labels = ["B GET p50", "B GET p99", "B job p50", "B job p99"]
    keys = ["get_p50_ms", "get_p99_ms", "finish_p50_ms", "finish_p99_ms"]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    width = 0.38
    for offset, (name, state) in enumerate((("A idle", report["quiet"]), ("A holding", report["busy"]))):
        axis.bar([i + offset * width for i in range(len(keys))], [state[k] for k in keys], width, label=name)
    axis.set_xticks([i + width / 2 for i in range(len(keys))], labels)
    axis.set_ylabel("ms")
    axis.set_title(
        f"Key B while key A holds {report['streams']:,} streams + {report['long_polls']} long-polls"
    )
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "tenants", argv)
    streams = 200 if args.quick else 10_000
    report: dict[str, Any] = {"quick": args.quick, "machine": machine()}
    with bench_stack("tenants") as (stack, scratch):
        redis = start_redis(stack, scratch / "redis")
        settings = tenant_settings(redis.url, str(scratch / "genq"), streams)
        start_worker(stack, "worker", settings, scratch)
        api, port = start_api(stack, "api", settings, scratch)
        report.update(run_async(measure(api.process.pid, port, redis.url, streams)))
    print_tables(report)
    write_report(args.out, "tenants", report, plot)
    return report


if __name__ == "__main__":
    main()

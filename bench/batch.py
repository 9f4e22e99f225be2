"""The Batch API under load: a large JSONL file through /v1/files and /v1/batches on the
placeholder engine (zero-cost tokens), so what is measured is genq's own path.

    python -m bench.batch                 # 50,000 lines (several minutes)
    python -m bench.batch --lines 10000   # another size
    python -m bench.batch --quick         # 300 lines: a smoke test
    python -m bench.batch --lines 10000 --uncacheable   # lines at temperature 1: no cache entries
    python -m bench.batch --lines 10000 --uncacheable --max-inflight 12   # batch lines below the
                                          # worker's 16 slots: room for interactive jobs

A real `genq api` process (its batch feeder included), a real worker and a private Redis. Measured:
- upload time (POST /v1/files, streamed) and validation time (batch created -> in_progress);
- lines per second through to the output file (in_progress -> completed, and created -> completed);
- Redis used_memory and the API's RSS, idle and at their peak during the batch (sampled);
- an interactive job's latency (POST /v1/jobs, then a long-poll until it ends), idle and while
  the batch runs, with their ratios (the target: within 2x of idle);
- that the output file holds exactly one line per custom_id.
Writes <out>/batch.json and <out>/batch.png (batch_uncacheable*, batch*_inflight<N> with those
options).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis.asyncio as aioredis

from bench.common import (
    BENCH_SETTINGS,
    bench_stack,
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
    start_worker,
    write_report,
)

MODEL = "placeholder-echo"
CHAT = "/v1/chat/completions"
SAMPLE_S = 0.25


def write_input(
    path: Path, lines: int, temperature: float = 0.0, model: str = MODEL, max_tokens: int = 8
) -> int:
    """A JSONL file of `lines` distinct chat requests (distinct: no cache hits; at temperature 0
    each answer is written to the response cache, above 0 without a seed none is); its size."""
    with path.open("wb") as out:
        for i in range(lines):
            body = {"model": model, "messages": [{"role": "user", "content": f"classify item {i}"}],
                    "max_tokens": max_tokens, "temperature": temperature}  # fmt: skip
            out.write(
                orjson.dumps({"custom_id": f"item-{i}", "method": "POST", "url": CHAT, "body": body}) + b"\n"
            )
    return path.stat().st_size


async def interactive_latency(api: httpx.AsyncClient, count: int) -> list[float]:
    """Submit-to-finished of `count` small interactive jobs, one after another (ms)."""
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        job = (
            await api.post("/v1/jobs", json={"prompt": f"interactive {i}", "max_tokens": 8, "cache": False})
        ).json()
        done = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 60})).json()
        assert done["status"] == "succeeded", done
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def memory(client: aioredis.Redis, api_pid: int) -> tuple[float, float]:
    """(Redis used_memory MB, API RSS MB) now."""
    info = await client.info("memory")
    return info["used_memory"] / 2**20, rss_mb(process_tree(api_pid))


async def run_batch(
    api: httpx.AsyncClient, client: aioredis.Redis, api_pid: int, path: Path
) -> dict[str, Any]:
    started = time.perf_counter()
    with path.open("rb") as source:
        uploaded = (
            await api.post("/v1/files", files={"file": (path.name, source)}, data={"purpose": "batch"})
        ).json()
    upload_s = time.perf_counter() - started
    created_at = time.perf_counter()
    batch = (await api.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": CHAT,
                                                   "completion_window": "24h"})).json()  # fmt: skip
    samples: list[dict[str, float]] = []
    in_progress_at: float | None = None
    interactive = asyncio.create_task(_interactive_during(api))
    while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
        await asyncio.sleep(SAMPLE_S)
        batch = (await api.get(f"/v1/batches/{batch['id']}")).json()
        if in_progress_at is None and batch["status"] != "validating":
            in_progress_at = time.perf_counter()
        redis_mb, rss = await memory(client, api_pid)
        done = batch["request_counts"]["completed"] + batch["request_counts"]["failed"]
        samples.append({"t": round(time.perf_counter() - created_at, 2), "lines_done": done,
                        "redis_mb": round(redis_mb, 1), "api_rss_mb": round(rss, 1)})  # fmt: skip
    finished_at = time.perf_counter()
    during = await interactive
    output = await _output_lines(api, batch)
    running_at = in_progress_at or finished_at
    return {"batch": batch, "upload_s": upload_s, "validation_s": running_at - created_at,
            "run_s": finished_at - running_at, "total_s": finished_at - created_at,
            "samples": samples, "during": during, "output_lines": output}  # fmt: skip


async def _interactive_during(api: httpx.AsyncClient) -> list[float]:
    """Interactive jobs while the batch runs: a few seconds in, then one after another for a while."""
    await asyncio.sleep(2.0)
    return await interactive_latency(api, 30)


async def _output_lines(api: httpx.AsyncClient, batch: dict[str, Any]) -> dict[str, int]:
    ids: list[str] = []
    tokens = 0
    async with api.stream("GET", f"/v1/files/{batch['output_file_id']}/content") as reply:
        async for line in reply.aiter_lines():
            if line:
                result = orjson.loads(line)
                ids.append(result["custom_id"])
                tokens += result["response"]["body"]["usage"]["completion_tokens"]
    return {"lines": len(ids), "distinct_custom_ids": len(set(ids)), "completion_tokens": tokens}


async def measure(
    port: int, redis_url: str, api_pid: int, path: Path, lines: int, probes: int
) -> dict[str, Any]:
    client = aioredis.Redis.from_url(redis_url)
    # An anonymous API takes an upload only with an Authorization header (docs/batches.md).
    headers = {"Authorization": "Bearer anonymous"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300, headers=headers) as api:
        await interactive_latency(api, 3)  # warm-up
        idle = await interactive_latency(api, probes)
        idle_redis, idle_rss = await memory(client, api_pid)
        run = await run_batch(api, client, api_pid, path)
    await client.aclose()
    samples = run.pop("samples")
    during = run.pop("during")
    idle_latency, busy_latency = latency_summary(idle), latency_summary(during)
    peak_redis = max(s["redis_mb"] for s in samples)
    peak_rss = max(s["api_rss_mb"] for s in samples)
    counts = run["batch"]["request_counts"]
    return {
        "lines": lines, "status": run["batch"]["status"], "request_counts": counts,
        "output": run["output_lines"], "upload_s": round(run["upload_s"], 2),
        "validation_s": round(run["validation_s"], 2), "run_s": round(run["run_s"], 2),
        "lines_per_s": round(lines / run["run_s"], 1),
        "completion_tokens_per_s": round(run["output_lines"]["completion_tokens"] / run["run_s"], 1),
        "lines_per_s_from_create": round(lines / run["total_s"], 1),
        "redis_idle_mb": round(idle_redis, 1), "redis_peak_mb": peak_redis,
        "api_rss_idle_mb": round(idle_rss, 1), "api_rss_peak_mb": peak_rss,
        "api_rss_growth_mb": round(peak_rss - idle_rss, 1),
        "interactive_idle": idle_latency, "interactive_during": busy_latency,
        "interactive_p50_ratio": ratio(busy_latency["p50_ms"], idle_latency["p50_ms"]),
        "interactive_p99_ratio": ratio(busy_latency["p99_ms"], idle_latency["p99_ms"]),
        "samples": samples,
    }  # fmt: skip


def print_tables(report: dict[str, Any]) -> None:
    print_table(
        f"Batch of {report['lines']:,} lines ({report['model']})",
        ["upload s", "validation s", "lines/s", "tokens/s", "Redis idle→peak MB", "API RSS growth MB",
         "interactive p50 ratio", "p99 ratio"],
        [[report["upload_s"], report["validation_s"], report["lines_per_s"],
          report["completion_tokens_per_s"],
          f"{report['redis_idle_mb']}→{report['redis_peak_mb']}", report["api_rss_growth_mb"],
          report["interactive_p50_ratio"], report["interactive_p99_ratio"]]],
    )  # fmt: skip


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    samples = report["samples"]
    figure, (lines_axis, memory_axis) = plt.subplots(1, 2, figsize=(10, 3.5))
    times = [s["t"] for s in samples]
    lines_axis.plot(times, [s["lines_done"] for s in samples])
    lines_axis.set_xlabel("s since the batch was created")
    lines_axis.set_ylabel("lines with a result")
    lines_axis.set_title(f"{report['lines']:,} lines, {report['lines_per_s']:,} lines/s")
    memory_axis.plot(times, [s["redis_mb"] for s in samples], label="Redis used_memory")
    memory_axis.plot(times, [s["api_rss_mb"] for s in samples], label="API RSS")
    memory_axis.set_xlabel("s")
    memory_axis.set_ylabel("MB")
    memory_axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def more_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lines", type=int, default=50_000, help="request lines in the file")
    parser.add_argument(
        "--uncacheable", action="store_true", help="lines at temperature 1 (no response-cache entries)"
    )
    parser.add_argument("--model", default=MODEL, help="the model the lines name (and the worker serves)")
    parser.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each line")
    parser.add_argument(
        "--max-inflight", type=int, default=None,
        help="GENQ_BATCH_MAX_INFLIGHT (and the window) for this run; default the settings' default",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "batch", argv, more_args)
    lines = 300 if args.quick else args.lines
    probes = 10 if args.quick else 30
    report: dict[str, Any] = {"quick": args.quick, "machine": machine()}
    with bench_stack("batch") as (stack, scratch):
        redis = start_redis(stack, scratch / "redis")
        settings = {**BENCH_SETTINGS, "REDIS_URL": redis.url, "DATA_DIR": str(scratch / "genq"),
                    "MODEL": args.model, "PLACEHOLDER_STEP_S": "0", "MAX_WAIT_S": "120"}  # fmt: skip
        if args.max_inflight is not None:
            limit = str(args.max_inflight)
            settings |= {"BATCH_MAX_INFLIGHT": limit, "BATCH_WINDOW": limit}
        report["batch_max_inflight"] = args.max_inflight
        start_worker(stack, "worker", settings, scratch)
        api, port = start_api(stack, "api", settings, scratch)
        path = scratch / "requests.jsonl"
        report["model"], report["max_tokens"] = args.model, args.max_tokens
        temperature = 1.0 if args.uncacheable else 0.0
        report["file_bytes"] = write_input(path, lines, temperature, args.model, args.max_tokens)
        report["cacheable_lines"] = not args.uncacheable
        report.update(run_async(measure(port, redis.url, api.process.pid, path, lines, probes)))
    print_tables(report)
    name = (
        "batch"
        + (f"_{args.model}" if args.model != MODEL else "")
        + ("_uncacheable" if args.uncacheable else "")
    )
    name += f"_inflight{args.max_inflight}" if args.max_inflight is not None else ""
    write_report(args.out, name, report, plot)
    return report


if __name__ == "__main__":
    main()

"""End-to-end benchmark: jobs through the whole stack (real `genq api` + one real `genq worker` on the
random-tiny model) against stock Celery running a no-op task (bench/bare_celery.py), in one run.

    python -m bench.end_to_end            # C = 1, 16, 64, 256 (~1-2 minutes)
    python -m bench.end_to_end --quick    # C = 1, 4, a few jobs: a smoke test

random-tiny is the real Qwen3 architecture with tiny dimensions and random weights, so a job's
inference costs little and genq's own overhead dominates. Each of C clients (closed loop, raw
keep-alive connections, bench/loadgen.py) submits a job with a unique prompt, "cache": false,
max_tokens 8 and `Prefer: wait`, so one POST returns the finished job; it then submits the next.
Per job: end-to-end latency, and overhead = latency - the job's own metrics.inference_ms. Bare
Celery: C asyncio clients, each LPUSHing a task message (the bytes genq's API pushes,
shared/jobqueue/kombu_layout.py) and BLPOPing the key the task writes; the round trip is the whole latency.
Also the CPU seconds per job of each process (API, worker, Redis), which show what limits the
rate. Writes <out>/end_to_end.json and <out>/end_to_end.png.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from bench import bare_celery
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
    run_async,
    service_env,
    start_api,
    start_redis,
    start_service,
    start_worker,
    write_report,
)
from bench.loadgen import closed_loop, json_post
from shared import keys
from shared.jobqueue.kombu_layout import task_message

MODEL = "random-tiny"
WAIT_S = 300


@dataclass(frozen=True)
class Sizes:
    concurrency: tuple[int, ...]
    #: Jobs (and bare tasks) per concurrency, in the same order.
    jobs: tuple[int, ...]
    max_batch_size: int
    max_tokens: int


FULL = Sizes((1, 16, 64, 256), (40, 320, 768, 1536), 64, 8)
QUICK = Sizes((1, 4), (4, 12), 8, 4)


# --- genq ---------------------------------------------------------------------------------------


def job_requests(count: int, max_tokens: int, tag: str) -> list[bytes]:
    """Unique prompts (no cache, no coalescing), each waited for in its own POST."""
    return [
        json_post(
            "/v1/jobs",
            orjson.dumps(
                {"prompt": f"Job {tag}-{index}: name three rivers.", "max_tokens": max_tokens, "cache": False}
            ),
            {"Prefer": f"wait={WAIT_S}"},
        )
        for index in range(count)
    ]


def run_genq(port: int, count: int, concurrency: int, max_tokens: int) -> dict[str, Any]:
    requests = job_requests(count, max_tokens, f"c{concurrency}-{uuid.uuid4().hex[:8]}")
    result = run_async(closed_loop("127.0.0.1", port, requests, concurrency, WAIT_S + 30, keep_bodies=True))
    latencies, overheads, inference, queued, batch = [], [], [], [], []
    failed = 0
    for reply in result.replies:
        job = orjson.loads(reply.body) if reply.status == 200 else {}
        if job.get("status") != "succeeded":
            failed += 1
            continue
        metrics = job["metrics"]
        latencies.append(reply.latency_ms)
        overheads.append(reply.latency_ms - metrics["inference_ms"])
        inference.append(metrics["inference_ms"])
        queued.append(metrics["queue_ms"])
        batch.append(float(metrics["batch_size"] or 0))
    return {
        "jobs": count,
        "succeeded": len(latencies),
        "failed_or_unfinished": failed + result.unfinished,
        "jobs_per_s": round(len(latencies) / result.duration_s, 1) if result.duration_s else 0.0,
        **latency_summary(latencies, "latency_"),
        **latency_summary(overheads, "overhead_"),
        **latency_summary(inference, "inference_"),
        **latency_summary(queued, "queue_"),
        "batch_size_p50": latency_summary(batch)["p50_ms"],
    }


# --- bare Celery --------------------------------------------------------------------------------


async def celery_round_trips(redis_url: str, count: int, concurrency: int) -> tuple[list[float], float]:
    """Round trips (ms) of `count` no-op tasks from `concurrency` clients, and the wall time (s)."""
    client = aioredis.Redis.from_url(redis_url, max_connections=2 * concurrency + 8)
    remaining = iter(range(count))
    latencies: list[float] = []

    async def one_client() -> None:
        for _ in remaining:  # shared: each task is taken by one client
            task_id = str(uuid.uuid4())
            message = task_message(bare_celery.TASK, task_id, [task_id], bare_celery.QUEUE, 0)
            began = time.perf_counter()
            await client.lpush(keys.queue_key(bare_celery.QUEUE, 0), message)
            if await client.blpop([bare_celery.DONE_KEY.format(task_id=task_id)], timeout=60) is None:
                raise TimeoutError(f"bare task {task_id} did not run within 60 s")
            latencies.append((time.perf_counter() - began) * 1000)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    finally:
        await client.aclose()
    return latencies, time.perf_counter() - started


def run_celery(redis_url: str, count: int, concurrency: int) -> dict[str, Any]:
    latencies, wall_s = run_async(celery_round_trips(redis_url, count, concurrency))
    return {
        "tasks": count,
        "tasks_per_s": round(len(latencies) / wall_s, 1),
        **latency_summary(latencies, "round_trip_"),
    }


# --- The run ------------------------------------------------------------------------------------


def cpu_per_item(pids: dict[str, int], run: Callable[[], dict[str, Any]], items_key: str) -> dict[str, Any]:
    """Run `run` and add the CPU seconds each process (tree) spent per item to its result."""
    trees = {name: process_tree(pid) for name, pid in pids.items()}
    before = {name: cpu_seconds(tree) for name, tree in trees.items()}
    result = run()
    items = max(1, result[items_key])
    result["cpu_ms_per_item"] = {
        name: round((cpu_seconds(tree) - before[name]) * 1000 / items, 3) for name, tree in trees.items()
    }
    return result


def start_bare_worker(stack: ExitStack, redis_url: str, concurrency: int, logs: Path) -> int:
    argv = [sys.executable, "-m", "celery", "-A", "bench.bare_celery", "worker", "--pool=threads",
            f"--concurrency={concurrency}", f"--queues={bare_celery.QUEUE}", "--without-gossip",
            "--without-mingle", "--loglevel=WARNING"]  # fmt: skip
    service = start_service(stack, "bare-celery", argv, service_env({"REDIS_URL": redis_url}), logs)
    run_celery(redis_url, 20, 4)  # warm-up; returns once the worker consumes
    return service.process.pid


def measure(sizes: Sizes, stack: ExitStack, scratch: Path) -> dict[str, Any]:
    redis = start_redis(stack, scratch / "redis")
    assert redis.process is not None
    settings = {**BENCH_SETTINGS, "REDIS_URL": redis.url, "DATA_DIR": str(scratch / "genq"), "MODEL": MODEL,
                "MAX_BATCH_SIZE": str(sizes.max_batch_size), "MAX_WAIT_S": str(WAIT_S),
                "MODEL_CACHE": str(Path(".genq/models").resolve())}  # fmt: skip
    worker = start_worker(stack, "worker", settings, scratch)
    api, port = start_api(stack, "api", settings, scratch)
    bare_pid = start_bare_worker(stack, redis.url, sizes.max_batch_size, scratch)
    run_genq(port, 8, 4, sizes.max_tokens)  # warm-up
    genq_pids = {"api": api.process.pid, "worker": worker.process.pid, "redis": redis.process.pid}
    celery_pids = {"celery_worker": bare_pid, "redis": redis.process.pid}
    runs = []
    for concurrency, count in zip(sizes.concurrency, sizes.jobs, strict=True):
        genq = cpu_per_item(
            genq_pids, partial(run_genq, port, count, concurrency, sizes.max_tokens), "succeeded"
        )
        celery = cpu_per_item(celery_pids, partial(run_celery, redis.url, count, concurrency), "tasks")
        runs.append(compare(concurrency, genq, celery))
        print(f"  C={concurrency}: genq {genq['jobs_per_s']} jobs/s, overhead p50 "
              f"{genq['overhead_p50_ms']} ms; celery {celery['tasks_per_s']} tasks/s, round trip p50 "
              f"{celery['round_trip_p50_ms']} ms")  # fmt: skip
    shown = {
        name: value
        for name, value in settings.items()
        if name not in ("REDIS_URL", "DATA_DIR", "MODEL_CACHE")
    }
    return {"settings": shown, "runs": runs, "targets": check_targets(runs)}


def compare(concurrency: int, genq: dict[str, Any], celery: dict[str, Any]) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "genq": genq,
        "celery": celery,
        "rate_ratio": ratio(genq["jobs_per_s"], celery["tasks_per_s"]),
        "overhead_p50_ratio": ratio(genq["overhead_p50_ms"], celery["round_trip_p50_ms"]),
    }


def check_targets(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    top = max(runs, key=lambda run: run["concurrency"])
    return {
        "at_concurrency": top["concurrency"],
        "genq_rate_at_least_celery": top["rate_ratio"] is not None and top["rate_ratio"] >= 1.0,
        "overhead_p50_under_2x_celery_round_trip": all(
            run["overhead_p50_ratio"] is not None and run["overhead_p50_ratio"] < 2.0 for run in runs
        ),
    }


# --- Output -------------------------------------------------------------------------------------


def print_tables(report: dict[str, Any]) -> None:
    rows = [
        [run["concurrency"], run["genq"]["jobs_per_s"], run["celery"]["tasks_per_s"], run["rate_ratio"],
         run["genq"]["overhead_p50_ms"], run["genq"]["overhead_p99_ms"], run["celery"]["round_trip_p50_ms"],
         run["celery"]["round_trip_p99_ms"], run["overhead_p50_ratio"], run["genq"]["inference_p50_ms"],
         run["genq"]["failed_or_unfinished"]]
        for run in report["runs"]
    ]  # fmt: skip
    print_table("genq (API + worker, random-tiny) vs bare Celery (no-op task)",
                ["C", "genq jobs/s", "celery tasks/s", "x celery", "overhead p50", "overhead p99",
                 "celery rt p50", "celery rt p99", "x celery rt", "inference p50", "failed"],
                rows)  # fmt: skip
    cpu_rows = [[run["concurrency"], *run["genq"]["cpu_ms_per_item"].values(),
                 *run["celery"]["cpu_ms_per_item"].values()] for run in report["runs"]]  # fmt: skip
    print_table("CPU ms per job / task", ["C", "genq api", "genq worker", "redis (genq)", "celery worker",
                "redis (celery)"], cpu_rows)  # fmt: skip
    print(f"targets: {report['targets']}")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    runs = report["runs"]
    labels = [str(run["concurrency"]) for run in runs]
    figure, (rates, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    positions = range(len(runs))
    rates.bar(
        [p - 0.2 for p in positions], [run["genq"]["jobs_per_s"] for run in runs], 0.4, label="genq jobs/s"
    )
    rates.bar([p + 0.2 for p in positions], [run["celery"]["tasks_per_s"] for run in runs], 0.4,
              label="bare Celery no-op tasks/s")  # fmt: skip
    rates.set_xticks(list(positions), labels)
    rates.set(xlabel="concurrent clients", ylabel="per second", title="Throughput", yscale="log")
    rates.legend()
    for key, source, style in (("overhead", "genq", "o-"), ("round_trip", "celery", "s--")):
        for q in ("p50", "p99"):
            latency.plot(
                labels, [run[source][f"{key}_{q}_ms"] for run in runs], style, label=f"{source} {key} {q}"
            )
    latency.set(xlabel="concurrent clients", ylabel="ms", yscale="log",
                title="genq overhead (latency - inference) vs Celery round trip")  # fmt: skip
    latency.legend(fontsize=8)
    figure.suptitle(f"{MODEL}, max_batch_size {report['sizes']['max_batch_size']}, "
                    f"{report['machine']['cpus']} CPUs (shared, noisy)")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "end_to_end", argv)
    sizes = QUICK if args.quick else FULL
    report: dict[str, Any] = {
        "quick": args.quick,
        "machine": machine(),
        "model": MODEL,
        "sizes": sizes.__dict__,
    }
    with bench_stack("end_to_end") as (stack, scratch):
        report.update(measure(sizes, stack, scratch))
    print_tables(report)
    write_report(args.out, "end_to_end", report, plot)
    return report


if __name__ == "__main__":
    main()

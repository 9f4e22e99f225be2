"""One webhook worker alone: what it delivers per second, and its CPU per delivery, with 1 and with
16 task threads.

    python -m bench.webhook_drain            # 4,000 deliveries per worker, three rounds (~2 minutes)
    python -m bench.webhook_drain --quick    # 400 deliveries, one round: a smoke test

bench/machinery.py's webhook run measures deliveries with everything else a job costs running on
the same cores (the submissions, the model worker, the benchmark's receiver), which on a 2-core
host moves the webhook worker's own cost with its neighbours. Here the jobs run first: N jobs with
a `completed` webhook to a local receiver (bench/machinery.py's Receiver, HTTP/1.1 keep-alive) go
through `genq api` and one model worker on the placeholder engine with no webhook worker up, so
their N delivery messages wait on the webhook queue (moved aside while it starts); then one `genq
worker --queues=webhooks --concurrency T` starts, makes 4 × T warm-up deliveries, and drains the
N, which come back on the queue in one command. Measured from then to the last delivery: the rate,
and its CPU per delivery (from /proc); every delivery must arrive, once. Then the same again with
the other thread count, in rounds (the order flipped each round). T = 1 shows the per-delivery
work itself; T = 16 (the default: GENQ_WORKER_CONCURRENCY, else max_batch_size) adds what 16
threads sharing one interpreter's GIL cost. Writes <out>/webhook_drain.json and a plot.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

from bench.common import (
    BENCH_SETTINGS,
    bench_stack,
    cpu_seconds,
    machine,
    parse_args,
    print_table,
    run_async,
    start_api,
    start_redis,
    start_worker,
    write_report,
)
from bench.machinery import MODEL, Receiver, submit_with_webhooks
from workers.webhooks.delivery import WEBHOOK_LIST

THREADS = (1, 16)
FULL_JOBS, FULL_ROUNDS = 4000, 3
#: Enough for the worker's CPU to show in /proc's 10 ms ticks: 40 deliveries cost ~12 ms, and a
#: quick run on a fast VM read 0 ms per delivery.
QUICK_JOBS, QUICK_ROUNDS = 400, 1
TIMEOUT_S = 300.0
#: Deliveries per thread made before the measured drain.
WARM_UP_PER_THREAD = 4
#: Where the queued messages wait while the webhook worker starts.
HELD = "genq-bench:webhooks-held"
#: The held messages back on the webhook queue in one step, in their order (BRPOP takes the tail).
RELEASE = (
    "redis.call('RPUSH', KEYS[2], unpack(redis.call('LRANGE', KEYS[1], 0, -1))) redis.call('DEL', KEYS[1])"
)


def drain(settings: dict[str, str], scratch: Path, port: int, jobs: int, threads: int) -> dict[str, Any]:
    """Queue `jobs` deliveries, then one webhook worker with `threads` threads drains them."""
    client = redis.Redis.from_url(settings["REDIS_URL"])
    receiver = Receiver()
    try:
        ids = run_async(submit_with_webhooks(port, jobs, 16, receiver.url))
        deadline = time.monotonic() + TIMEOUT_S
        while client.llen(WEBHOOK_LIST) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Out of the worker's sight until it is up and idle, then back in one command: it starts
        # on a full queue, and its CPU and time count from there (well within the reaper's
        # ORPHAN_CHECK_S, which would push a copy of a message missing that long).
        client.rename(WEBHOOK_LIST, HELD)
        with ExitStack() as stack:
            name = f"webhooks-{threads}-{time.monotonic_ns()}"
            args = ["--queues=webhooks", f"--concurrency={threads}"]
            pid = start_worker(stack, name, settings, scratch, args=args).process.pid
            # Warm-up: each thread's first deliveries pay its first connections and lookups.
            warm = run_async(submit_with_webhooks(port, WARM_UP_PER_THREAD * threads, 16, receiver.url))
            receiver.wait_for(warm, deadline)
            cpu_before, before = cpu_seconds([pid]), len(receiver.deliveries)
            started = time.perf_counter()
            client.eval(RELEASE, 2, HELD, WEBHOOK_LIST)
            receiver.wait_for(ids, deadline)
            wall_s, cpu_s = time.perf_counter() - started, cpu_seconds([pid]) - cpu_before
    finally:
        receiver.close()
        client.close()
    drained = receiver.deliveries[before:]
    delivered = {job for job, _, _ in drained}
    return {
        "threads": threads,
        "jobs": jobs,
        "all_delivered": set(ids) <= delivered and len(ids) == jobs,
        "redundant_deliveries": len(drained) - len(delivered),
        "deliveries_per_s": round(len(drained) / wall_s, 1),
        "cpu_ms_per_delivery": round(cpu_s * 1000 / max(1, len(drained)), 3),
    }


def measure(jobs: int, rounds: int, stack: ExitStack, scratch: Path) -> dict[str, Any]:
    redis_server = start_redis(stack, scratch / "redis")
    settings = {**BENCH_SETTINGS, "REDIS_URL": redis_server.url, "DATA_DIR": str(scratch / "genq"),
                "MODEL": MODEL, "PLACEHOLDER_STEP_S": "0", "WEBHOOK_ALLOW_PRIVATE": "1"}  # fmt: skip
    start_worker(stack, "worker", settings, scratch)
    _, port = start_api(stack, "api", settings, scratch)
    runs = []
    for index in range(rounds):
        for threads in THREADS if index % 2 == 0 else THREADS[::-1]:
            run = drain(settings, scratch, port, jobs, threads)
            print(f"  round {index + 1}, {threads} thread(s): {run['deliveries_per_s']} deliveries/s, "
                  f"{run['cpu_ms_per_delivery']} ms CPU each", flush=True)  # fmt: skip
            runs.append(run)
    medians = {
        str(threads): {
            key: statistics.median(run[key] for run in runs if run["threads"] == threads)
            for key in ("deliveries_per_s", "cpu_ms_per_delivery")
        }
        for threads in THREADS
    }
    return {"runs": runs, "medians": medians}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (rates, cpu) = plt.subplots(1, 2, figsize=(9, 3.6))
    for threads in THREADS:
        runs = [run for run in report["runs"] if run["threads"] == threads]
        rates.plot(
            range(1, len(runs) + 1),
            [run["deliveries_per_s"] for run in runs],
            "o-",
            label=f"{threads} thread(s)",
        )
        cpu.plot(
            range(1, len(runs) + 1),
            [run["cpu_ms_per_delivery"] for run in runs],
            "o-",
            label=f"{threads} thread(s)",
        )
    rates.set(xlabel="round", ylabel="deliveries/s", title="One webhook worker draining its queue")
    cpu.set(xlabel="round", ylabel="ms", title="Its CPU per delivery")
    for axis in (rates, cpu):
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "webhook_drain", argv)
    jobs, rounds = (QUICK_JOBS, QUICK_ROUNDS) if args.quick else (FULL_JOBS, FULL_ROUNDS)
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "jobs": jobs, "rounds": rounds}
    with bench_stack("webhook-drain") as (stack, scratch):
        report.update(measure(jobs, rounds, stack, scratch))
    rows = [
        [threads, m["deliveries_per_s"], m["cpu_ms_per_delivery"]] for threads, m in report["medians"].items()
    ]
    print_table(f"One webhook worker draining {jobs} deliveries (medians of {rounds} round(s))",
                ["threads", "deliveries/s", "CPU ms per delivery"], rows)  # fmt: skip
    write_report(args.out, "webhook_drain", report, plot)
    return report


if __name__ == "__main__":
    main()

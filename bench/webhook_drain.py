"""One webhook worker alone: what it delivers per second, and its CPU per delivery, with 1 and with
16 task threads.

    python -m bench.webhook_drain                      # 4,000 deliveries per worker, three rounds (~2 min)
    python -m bench.webhook_drain --base /tmp/base-h2  # and another tree's beside it, same rounds (~5 min)
    python -m bench.webhook_drain --quick [--base DIR] # 400 deliveries, one round: a smoke test

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
threads sharing one interpreter's GIL cost. `--base DIR` runs the same beside this tree on another
tree's code (e.g. `git worktree add /tmp/base-h2 180958b`): a stack of its own (Redis, API, model
worker, each drain's webhook worker), the two sides' drains alternating within each round; its
runs, medians and this tree's ratios to them go under "base". Writes <out>/webhook_drain.json and
a plot.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import (
    BENCH_SETTINGS,
    ROOT,
    Service,
    bench_stack,
    cpu_seconds,
    machine,
    parse_args,
    print_table,
    ratio,
    run_async,
    service_env,
    start_http,
    start_redis,
    start_service,
    write_report,
)
from bench.machinery import MODEL, Receiver, submit_with_webhooks
from bench.webhook_attempt import add_base_option, tree_commit
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


@dataclass(frozen=True)
class Side:
    """One tree's stack: its code, its settings (Redis among them), its API's port."""

    name: str
    tree: Path
    settings: dict[str, str]
    port: int


def tree_env(tree: Path, settings: dict[str, str]) -> dict[str, str]:
    """A service's environment that runs `tree`'s code (none from the working directory)."""
    return service_env(settings) | {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}


def start_tree_worker(
    stack: ExitStack, name: str, side: Side, scratch: Path, args: Sequence[str] = ()
) -> Service:
    """A `genq worker` on the side's code, returned once warmed up (bench.common.start_worker's
    readiness, for any tree)."""
    ready = scratch / f"{name}.ready"
    settings = {
        **side.settings,
        "WORKER_READY_FILE": str(ready),
        "WORKER_PIDFILE": str(scratch / f"{name}.pid"),
    }
    argv = [sys.executable, "-m", "cli.main", "worker", *args]
    service = start_service(stack, name, argv, tree_env(side.tree, settings), scratch)
    deadline = time.monotonic() + 180
    while not ready.exists():
        service.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready:\n{service.log_tail()}")
        time.sleep(0.05)
    return service


def start_side(stack: ExitStack, scratch: Path, name: str, tree: Path) -> Side:
    """Redis, a model worker and an API on `tree`'s code."""
    redis_server = start_redis(stack, scratch / f"redis-{name}")
    settings = {**BENCH_SETTINGS, "REDIS_URL": redis_server.url, "DATA_DIR": str(scratch / f"genq-{name}"),
                "MODEL": MODEL, "PLACEHOLDER_STEP_S": "0", "WEBHOOK_ALLOW_PRIVATE": "1"}  # fmt: skip
    side = Side(name, tree, settings, 0)
    start_tree_worker(stack, f"worker-{name}", side, scratch)
    argv = [sys.executable, "-m", "cli.main", "api", "--workers", "1"]
    _, port = start_http(stack, f"api-{name}", argv, tree_env(tree, settings), scratch, "/healthz")
    return Side(name, tree, settings, port)


def drain(side: Side, scratch: Path, jobs: int, threads: int) -> dict[str, Any]:
    """Queue `jobs` deliveries, then one webhook worker with `threads` threads drains them."""
    client = redis.Redis.from_url(side.settings["REDIS_URL"])
    receiver = Receiver()
    try:
        ids = run_async(submit_with_webhooks(side.port, jobs, 16, receiver.url))
        deadline = time.monotonic() + TIMEOUT_S
        while client.llen(WEBHOOK_LIST) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Out of the worker's sight until it is up and idle, then back in one command: it starts
        # on a full queue, and its CPU and time count from there (well within the reaper's
        # ORPHAN_CHECK_S, which would push a copy of a message missing that long).
        client.rename(WEBHOOK_LIST, HELD)
        with ExitStack() as stack:
            name = f"webhooks-{side.name}-{threads}-{time.monotonic_ns()}"
            args = ["--queues=webhooks", f"--concurrency={threads}"]
            pid = start_tree_worker(stack, name, side, scratch, args).process.pid
            # Warm-up: each thread's first deliveries pay its first connections and lookups.
            warm = run_async(submit_with_webhooks(side.port, WARM_UP_PER_THREAD * threads, 16, receiver.url))
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


#: What the medians hold, per thread count.
MEASURES = ("deliveries_per_s", "cpu_ms_per_delivery")


def measure(jobs: int, rounds: int, stack: ExitStack, scratch: Path, base: Path | None) -> dict[str, Any]:
    sides = [start_side(stack, scratch, "this", ROOT)]
    if base is not None:
        sides.append(start_side(stack, scratch, "base", base))
    runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
    for index in range(rounds):
        for threads in THREADS if index % 2 == 0 else THREADS[::-1]:
            for side in sides if index % 2 == 0 else sides[::-1]:
                run = drain(side, scratch, jobs, threads)
                print(f"  round {index + 1}, {side.name}, {threads} thread(s): {run['deliveries_per_s']} "
                      f"deliveries/s, {run['cpu_ms_per_delivery']} ms CPU each", flush=True)  # fmt: skip
                runs[side.name].append(run)
    report: dict[str, Any] = {"runs": runs["this"], "medians": medians(runs["this"])}
    if base is not None:
        report["base"] = {"tree": str(base), "commit": tree_commit(base), "runs": runs["base"],
                          "medians": medians(runs["base"])}  # fmt: skip
        ours, theirs = report["medians"], report["base"]["medians"]
        report["ratios_to_base"] = {
            threads: {key: ratio(ours[threads][key], theirs[threads][key]) for key in MEASURES}
            for threads in ours
        }
    return report


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {
        str(threads): {
            key: statistics.median(run[key] for run in runs if run["threads"] == threads) for key in MEASURES
        }
        for threads in THREADS
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (rates, cpu) = plt.subplots(1, 2, figsize=(9, 3.6))
    sides = {"this": report["runs"]} | ({"base": report["base"]["runs"]} if "base" in report else {})
    for side, side_runs in sides.items():
        for threads in THREADS:
            runs = [run for run in side_runs if run["threads"] == threads]
            label = f"{side}, {threads} thread(s)" if len(sides) > 1 else f"{threads} thread(s)"
            rounds = range(1, len(runs) + 1)
            rates.plot(rounds, [run["deliveries_per_s"] for run in runs], "o-", label=label)
            cpu.plot(rounds, [run["cpu_ms_per_delivery"] for run in runs], "o-", label=label)
    rates.set(xlabel="round", ylabel="deliveries/s", title="One webhook worker draining its queue")
    cpu.set(xlabel="round", ylabel="ms", title="Its CPU per delivery")
    for axis in (rates, cpu):
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "webhook_drain", argv, add_base_option)
    jobs, rounds = (QUICK_JOBS, QUICK_ROUNDS) if args.quick else (FULL_JOBS, FULL_ROUNDS)
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "jobs": jobs, "rounds": rounds,
                              "commit": tree_commit(ROOT)}  # fmt: skip
    with bench_stack("webhook-drain") as (stack, scratch):
        report.update(measure(jobs, rounds, stack, scratch, args.base.resolve() if args.base else None))
    sides = {"this": report["medians"]} | ({"base": report["base"]["medians"]} if args.base else {})
    rows = [[side, threads, m["deliveries_per_s"], m["cpu_ms_per_delivery"]]
            for side, by_threads in sides.items() for threads, m in by_threads.items()]  # fmt: skip
    print_table(f"One webhook worker draining {jobs} deliveries (medians of {rounds} round(s))",
                ["side", "threads", "deliveries/s", "CPU ms per delivery"], rows)  # fmt: skip
    if args.base:
        print("this / base:", report["ratios_to_base"])
    write_report(args.out, "webhook_drain", report, plot)
    return report


if __name__ == "__main__":
    main()

"""The take path (a task thread takes its next job straight from kombu's list, shared/jobqueue/lua/take.lua)
against kombu's public consumer, and against another tree, in one run.

    python -m bench.take_path --base /tmp/base-h4   # C = 16, 64, 256, 3 rounds (~8 minutes)
    python -m bench.take_path --quick [--base DIR]  # C = 4, a few jobs, one round: a smoke test

Sides, each a stack of its own (Redis, `genq api`, one `genq worker`, and bare Celery on the same
Redis, bench/bare_celery.py), with machinery's settings (bench/machinery.py: genq's defaults, the
placeholder model at 0 s/step, the services' limits off):
- `take`: this tree as it ships (GENQ_WORKER_TAKE_QUEUED on);
- `public`: this tree with GENQ_WORKER_TAKE_QUEUED=0: every job comes to a task thread through
  Celery's consumer (kombu's BRPOP, its unacked bookkeeping, Celery's dispatch and ack);
- `base`, with --base DIR: that tree (e.g. `git worktree add /tmp/base-h4 180958b`), as it ships.

Clients run machinery's `poll` loop (POST, then a long-poll). Per side and C, each round: jobs/s,
its ratio to bare Celery measured on that side's Redis just before (`rate_ratio`), p50/p99, and CPU
ms per job of the worker, the API and Redis. The sides take turns within a round, in the opposite
order each round; the report gives each side's medians over rounds and `take`'s ratios to the
others (`take_vs`: its rate and worker CPU over theirs). Writes <out>/take_path.json and .png.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_SETTINGS,
    ROOT,
    bench_stack,
    machine,
    parse_args,
    ratio,
    start_http,
    start_redis,
    write_report,
)
from bench.end_to_end import cpu_per_item, run_celery, start_bare_worker
from bench.machinery import MODEL, run_genq
from bench.webhook_attempt import add_base_option, tree_commit
from bench.webhook_drain import Side, start_tree_worker, tree_env

FULL = ((16, 64, 256), (1200, 2400, 3840), 3)
QUICK = ((4,), (12,), 1)
#: What the medians hold.
MEASURES = ("jobs_per_s", "rate_ratio", "latency_p50_ms", "latency_p99_ms", "worker_cpu_ms", "api_cpu_ms",
            "redis_cpu_ms")  # fmt: skip


def start_side(
    stack: ExitStack, scratch: Path, name: str, tree: Path, take: bool
) -> tuple[Side, dict[str, int]]:
    """Redis, a model worker, an API and bare Celery on `tree`'s code; the side and its pids."""
    redis_server = start_redis(stack, scratch / f"redis-{name}")
    assert redis_server.process is not None
    settings = {**BENCH_SETTINGS, "REDIS_URL": redis_server.url, "DATA_DIR": str(scratch / f"genq-{name}"),
                "MODEL": MODEL, "PLACEHOLDER_STEP_S": "0"}  # fmt: skip
    settings["WORKER_TAKE_QUEUED"] = "1" if take else "0"
    side = Side(name, tree, settings, 0)
    worker = start_tree_worker(stack, f"worker-{name}", side, scratch)
    argv = [sys.executable, "-m", "cli.main", "api", "--workers", "1"]
    api, port = start_http(stack, f"api-{name}", argv, tree_env(tree, settings), scratch, "/healthz")
    bare = start_bare_worker(stack, redis_server.url, 16, scratch / f"bare-{name}")
    run_genq(port, 8, 4, "poll", None)  # warm-up
    pids = {"worker": worker.process.pid, "api": api.process.pid, "redis": redis_server.process.pid,
            "celery_worker": bare}  # fmt: skip
    return Side(name, tree, settings, port), pids


def one_run(side: Side, pids: dict[str, int], concurrency: int, count: int) -> dict[str, Any]:
    celery = run_celery(side.settings["REDIS_URL"], count, concurrency)
    genq_pids = {name: pids[name] for name in ("worker", "api", "redis")}
    run = cpu_per_item(genq_pids, partial(run_genq, side.port, count, concurrency, "poll", None), "succeeded")
    cpu = run.pop("cpu_ms_per_item")
    kept = ("jobs_per_s", "latency_p50_ms", "latency_p99_ms", "failed_or_unfinished")
    celery_rate = celery["tasks_per_s"]
    return {
        "concurrency": concurrency,
        **{key: run[key] for key in kept},
        "celery_tasks_per_s": celery_rate,
        "rate_ratio": ratio(run["jobs_per_s"], celery_rate),
        **{f"{n}_cpu_ms": cpu[n] for n in genq_pids},
    }


def medians(runs: list[dict[str, Any]], sizes: Sequence[int]) -> dict[str, dict[str, float]]:
    return {
        str(c): {
            key: statistics.median(run[key] for run in runs if run["concurrency"] == c) for key in MEASURES
        }
        for c in sizes
    }


def take_vs(take: dict[str, dict[str, float]], other: dict[str, dict[str, float]]) -> dict[str, Any]:
    """`take`'s rate and worker CPU over another side's, per C."""
    return {
        c: {key: ratio(take[c][key], other[c][key]) for key in ("jobs_per_s", "worker_cpu_ms")} for c in take
    }


def measure(
    trees: dict[str, tuple[Path, bool]], sizes: tuple[Any, ...], stack: ExitStack, scratch: Path
) -> dict[str, Any]:
    concurrency, counts, rounds = sizes
    sides = [start_side(stack, scratch, name, tree, take) for name, (tree, take) in trees.items()]
    runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side, _ in sides}
    for index in range(rounds):
        for c, count in zip(concurrency, counts, strict=True):
            for side, pids in sides if index % 2 == 0 else sides[::-1]:
                run = one_run(side, pids, c, count)
                runs[side.name].append(run)
                rate = f"{run['jobs_per_s']} jobs/s (x{run['rate_ratio']} celery)"
                cpu = f"worker {run['worker_cpu_ms']} ms CPU/job"
                print(f"  round {index + 1}, C={c}, {side.name}: {rate}, {cpu}", flush=True)
    report: dict[str, Any] = {
        "runs": runs,
        "medians": {name: medians(r, concurrency) for name, r in runs.items()},
    }
    take = report["medians"]["take"]
    report["take_vs"] = {
        other: take_vs(take, theirs) for other, theirs in report["medians"].items() if other != "take"
    }
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (rates, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, by_c in report["medians"].items():
        labels = list(by_c)
        rates.plot(labels, [by_c[c]["rate_ratio"] for c in labels], "o-", label=name)
        cpu.plot(labels, [by_c[c]["worker_cpu_ms"] for c in labels], "o-", label=name)
    rates.axhline(1.0, color="grey", linestyle=":")
    rates.set(
        xlabel="concurrent clients", ylabel="jobs/s over bare Celery's tasks/s", title="Rate vs bare Celery"
    )
    cpu.set(xlabel="concurrent clients", ylabel="ms", title="Worker CPU per job")
    rates.legend(fontsize=8)
    cpu.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "take_path", argv, add_base_option)
    trees = {"take": (ROOT, True), "public": (ROOT, False)}
    if args.base:
        trees["base"] = (args.base.resolve(), True)
    sizes = QUICK if args.quick else FULL
    commits = {name: tree_commit(tree) for name, (tree, _) in trees.items()}
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "model": MODEL, "trees": commits}
    with bench_stack("take_path") as (stack, scratch):
        report.update(measure(trees, sizes, stack, scratch))
    for name, by_c in report["medians"].items():
        print(name, by_c)
    print("take vs:", report["take_vs"])
    write_report(args.out, "take_path", report, plot)
    return report


if __name__ == "__main__":
    main()

"""The reaper's orphan checks against a deep queue: what one pass costs Redis as the queue grows.

    python -m bench.orphan_checks            # N = 2,500, 5,000, 10,000, 20,000 queued jobs (~1 minute)
    python -m bench.orphan_checks --quick    # N = 200, 400: a smoke test

N jobs are accepted through the API's own submit script (record, message in the queue list,
reaper indexes) on a fresh embedded Redis, with no worker: a queue that is not draining, as under
overload. Then the reaper (shared/jobqueue/reaper.py, one process, its lock cleared between turns) works
through every orphan check that is due ORPHAN_CHECK_S later, as it does once a period. Reported per
N: Redis's own CPU for that pass (INFO cpu, so other load on the host does not count), the wall
time, the CPU per check, the share of one core it costs when repeated every ORPHAN_CHECK_S, and the
outcome of every check (all should be `held`: each message is in its list). The growth from one N
to twice that shows the order: 2x is linear, 4x quadratic. Writes <out>/orphan_checks.json and .png.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from api.jobs.store import NewJob, submit_labels
from bench.common import bench_stack, machine, parse_args, start_redis, write_report
from shared import keys
from shared.jobqueue import scripts
from shared.jobqueue.reaper import BATCH, Reaper
from shared.jobqueue.records import job_message

MODEL = "placeholder-echo"
OWNER = "bench-key"
FULL_SIZES = (2_500, 5_000, 10_000, 20_000)
QUICK_SIZES = (200, 400)
DAY_S = 86_400


def submit_jobs(client: redis.Redis, count: int) -> None:
    """Accept `count` jobs through the submit script, as JobStore.submit does (no bounds, no cache)."""
    submit = scripts.Script(client, "submit")
    client.script_load(submit.text)
    queue = keys.queue_for_model(MODEL)
    pipe = client.pipeline(transaction=False)
    for _ in range(count):
        now, job_id = time.time(), str(uuid.uuid4())
        job = NewJob(job_id=job_id, owner=OWNER, model=MODEL, queue=queue, input_json=b'{"prompt":"hi"}',
                     metadata_json=b"{}", created_at=now, deadline=now + DAY_S)  # fmt: skip
        message, queue_list = job_message(job_id, queue, 0)
        today = int(now // DAY_S)
        pipe.evalsha(*submit.evalsha(
            keys=[keys.job(job_id), keys.owner_jobs(OWNER), queue_list, "", "", "", keys.owner_live(OWNER)],
            args=[job_id, int(now * 1e6), DAY_S, message, 60, "", "(0", repr(now), "", "",
                  0, 0, job.stored_bytes, today, 1, *job.fields()],
            labels=submit_labels(job, today, 1, bounded=False),
        ))  # fmt: skip
        if len(pipe) >= 500:
            pipe.execute()
    pipe.execute()


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def one_pass(client: redis.Redis) -> dict[str, Any]:
    """Every orphan check due one period after submission, run by the reaper a batch a turn."""
    reaper = Reaper(client, 3, DAY_S, 1.0)
    due_at = time.time() + scripts.ORPHAN_CHECK_S + 1
    cpu, started, outcomes = redis_cpu_s(client), time.perf_counter(), 0
    while client.zcount(keys.ORPHAN_CHECKS, "-inf", due_at):
        client.delete(keys.REAPER_LOCK)
        outcomes += sum(reaper.run_once(due_at).values())  # actions: anything but `held`
    return {"redis_cpu_s": redis_cpu_s(client) - cpu, "wall_s": time.perf_counter() - started,
            "actions": outcomes}  # fmt: skip


def measure(client: redis.Redis, count: int) -> dict[str, Any]:
    client.flushall()
    submit_jobs(client, count)
    passed = one_pass(client)
    return {
        "queued": count,
        **{k: round(v, 3) for k, v in passed.items()},
        "redis_cpu_ms_per_check": round(1000 * passed["redis_cpu_s"] / count, 3),
        "core_share_at_period": round(passed["redis_cpu_s"] / scripts.ORPHAN_CHECK_S, 3),
        "still_held_in_list": int(client.zcount(keys.ORPHAN_CHECKS, "-inf", "+inf")),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    runs = report["runs"]
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    axes.plot([r["queued"] for r in runs], [r["redis_cpu_s"] for r in runs], marker="o")
    axes.set(xlabel="jobs queued", ylabel="Redis CPU for one pass (s)",
             title=f"Orphan checks, one pass every {scripts.ORPHAN_CHECK_S} s")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "orphan_checks", argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "batch": BATCH,
                              "orphan_check_s": scripts.ORPHAN_CHECK_S, "runs": []}  # fmt: skip
    with bench_stack("orphan_checks") as (stack, scratch):
        client = redis.Redis.from_url(start_redis(stack, scratch / "redis").url)
        for count in sizes:
            run = measure(client, count)
            report["runs"].append(run)
            print(f"N={count:>6,}: Redis {run['redis_cpu_s']:.2f} s CPU for one pass "
                  f"({run['redis_cpu_ms_per_check']:.3f} ms a check, {run['core_share_at_period']:.0%} of a "
                  f"core every {scripts.ORPHAN_CHECK_S} s), wall {run['wall_s']:.2f} s")  # fmt: skip
    runs = report["runs"]
    report["growth_per_doubling"] = [
        round(b["redis_cpu_s"] / a["redis_cpu_s"], 2) if a["redis_cpu_s"] > 0 else None
        for a, b in itertools.pairwise(runs)
    ]
    print(
        f"Redis CPU growth per doubling of the queue: {report['growth_per_doubling']} (2 linear, 4 quadratic)"
    )
    write_report(args.out, "orphan_checks", report, plot)
    return report


if __name__ == "__main__":
    main()

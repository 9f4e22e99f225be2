"""What a pub/sub message costs the API's listener, as this tree has it and, with --base, as
another checkout of genq has it, in the same run.

    python -m bench.pubsub                            # 20,000 messages a round, 5 rounds per batch size
    python -m bench.pubsub --base /tmp/base-h3a       # and the same rounds, in turn, for that checkout
    python -m bench.pubsub --quick                    # 1,000 messages, 1 round: a smoke test

The listener is the API's (api/jobs/events.py's JobEvents, one waiter per job as long-polls hold
them), run in a process of its own started in the checkout it measures (`new`: this tree;
`base`: --base, e.g. a `git worktree add /tmp/base-h3a 180958b` of the commit before the listener
moved onto redis-py's public PubSub). A publisher in another process PUBLISHes job ids on the
job-events channel in pipelines of B messages (B = 1, 2, 16) with a short pause after each, so
that B messages tend to arrive in one read, as a busy worker's do; the last message names the job
the listener waits for. Reported per checkout and B: the listener process's CPU per message
(time.process_time from its subscription to that last message; the publisher and Redis are other
processes), the median and the largest of the rounds, and new ÷ base from the medians.
Writes <out>/pubsub.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, bench_stack, machine, parse_args, start_redis, write_report
from shared import keys

BATCHES = (1, 2, 16)
LAST = "last-job"
#: The publisher: `count` job ids in pipelines of `batch`, a pause after each, then LAST.
PUBLISHER = """
import sys, time, redis
port, count, batch = map(int, sys.argv[1:])
client = redis.Redis(port=port)
pipe = client.pipeline(transaction=False)
for i in range(count):
    pipe.publish({channel!r}, "job-%d" % i)
    if len(pipe) >= batch:
        pipe.execute()
        time.sleep(0.0003)
pipe.execute()
client.publish({channel!r}, {last!r})
"""
#: The listener, run in the checkout it measures (JobEvents's face is the same in both): prints
#: `ready` once subscribed (and the wake-all that follows is done), then its CPU seconds from
#: then to the message naming LAST.
LISTENER = """
import asyncio, sys, time
import redis.asyncio as aioredis
from api.jobs.events import JobEvents

async def main(url):
    probe = aioredis.Redis.from_url(url)
    listener = JobEvents(aioredis.Redis.from_url(url))
    listener.start()
    with listener.watch({last!r}) as ended:
        while (await probe.pubsub_numsub({channel!r}))[0][1] < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        ended.clear()
        print("ready", flush=True)
        started = time.process_time()
        await ended.wait()
        print(time.process_time() - started, flush=True)
    await listener.stop()

asyncio.run(main(sys.argv[1]))
"""


async def one_round(url: str, port: int, tree: Path, count: int, batch: int) -> float:
    """CPU seconds of the listener per message, for `count` messages in pipelines of `batch`."""
    code = LISTENER.format(channel=keys.JOB_EVENTS_CHANNEL, last=LAST)
    listener = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, url, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert listener.stdout is not None
    try:
        ready = await asyncio.wait_for(listener.stdout.readline(), timeout=60)
        if ready.strip() != b"ready":
            raise RuntimeError(f"the listener in {tree} never subscribed")
        publisher_code = PUBLISHER.format(channel=keys.JOB_EVENTS_CHANNEL, last=LAST)
        publisher = await asyncio.create_subprocess_exec(
            sys.executable, "-c", publisher_code, str(port), str(count), str(batch)
        )
        spent = float(await asyncio.wait_for(listener.stdout.readline(), timeout=120))
        await asyncio.wait_for(publisher.wait(), timeout=30)
        await asyncio.wait_for(listener.wait(), timeout=30)
    finally:
        if listener.returncode is None:
            listener.kill()
            await listener.wait()
    return spent / (count + 1)


async def measure(
    url: str, port: int, trees: dict[str, Path], count: int, rounds: int
) -> list[dict[str, Any]]:
    runs = []
    for batch in BATCHES:
        spent: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, tree in trees.items():  # in turn, so that a change in the machine's speed hits both
                spent[name].append(await one_round(url, port, tree, count, batch))
        run: dict[str, Any] = {"batch": batch, "messages": count}
        for name in trees:
            us = [1e6 * s for s in spent[name]]
            run[name] = {
                "cpu_us_per_message_median": round(statistics.median(us), 2),
                "cpu_us_per_message_max": round(max(us), 2),
                "rounds": [round(u, 2) for u in us],
            }
        line = ", ".join(f"{name} {run[name]['cpu_us_per_message_median']:.1f} us" for name in trees)
        if "base" in trees:
            run["new_over_base"] = round(
                run["new"]["cpu_us_per_message_median"] / run["base"]["cpu_us_per_message_median"], 3
            )
            line += f" (x{run['new_over_base']})"
        runs.append(run)
        print(f"B={batch:>2}: {line} of the listener's CPU a message")
    return runs


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    runs, trees = report["runs"], list(report["trees"])
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    spots = range(len(runs))
    width = 0.8 / len(trees)
    for index, name in enumerate(trees):
        offset = (index - (len(trees) - 1) / 2) * width
        axes.bar(
            [i + offset for i in spots],
            [r[name]["cpu_us_per_message_median"] for r in runs],
            width,
            label=name,
        )
    axes.set_xticks(list(spots), [f"{r['batch']} a read" for r in runs])
    axes.set(ylabel="listener CPU per message (us)", title="Pub/sub listener, per message")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", type=Path, default=None,
                        help="another checkout of genq, its listener measured beside this one")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "pubsub", argv, _options)
    count, rounds = (1_000, 1) if args.quick else (20_000, 5)
    trees = {"new": ROOT} if args.base is None else {"base": args.base.resolve(), "new": ROOT}
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "runs": [],
                              "trees": {name: str(tree) for name, tree in trees.items()}}  # fmt: skip
    with bench_stack("pubsub") as (stack, scratch):
        server = start_redis(stack, scratch / "redis")
        report["runs"] = asyncio.run(measure(server.url, server.port, trees, count, rounds))
    write_report(args.out, "pubsub", report, plot)
    return report


if __name__ == "__main__":
    main()

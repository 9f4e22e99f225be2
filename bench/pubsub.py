"""What a pub/sub message costs the API's listener: its own Protocol against redis-py's PubSub.

    python -m bench.pubsub            # 20,000 messages a round, 5 rounds per way and batch size (~1 min)
    python -m bench.pubsub --quick    # 1,000 messages, 1 round: a smoke test

The listener is the API's (api/jobs/events.py's JobEvents, one waiter per job as long-polls hold
them), run both ways in turn in this process: as it runs now (`raw`: api/edge/subscription.py's
Protocol hands each message to the waiters from `data_received`) and through redis-py's
`PubSub.get_message` loop (`pubsub`: what it did before, and what it falls back on). A publisher
in another process PUBLISHes job ids on the job-events channel in pipelines of B messages (B = 1,
2, 16) with a short pause after each, so that B messages tend to arrive in one read, as a busy
worker's do; the last message names the job the run waits for. Reported per way and B: this
process's CPU per message (time.process_time over the run; the publisher and Redis are other
processes), the median and the largest of the rounds, and raw ÷ pubsub from the medians.
Writes <out>/pubsub.json and .png.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from api.jobs.events import JobEvents
from bench.common import bench_stack, machine, parse_args, start_redis, write_report
from shared import keys

BATCHES = (1, 2, 16)
WAYS = ("raw", "pubsub")
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


async def one_round(url: str, port: int, way: str, count: int, batch: int) -> float:
    """CPU seconds of this process per message, for `count` messages in pipelines of `batch`."""
    listener = JobEvents(aioredis.Redis.from_url(url, decode_responses=True))
    listener._raw = way == "raw"  # the fallback, chosen here instead of by a failed take-over
    listener.start()
    try:
        with listener.watch(LAST) as ended:
            await _subscribed(url)
            ended.clear()  # set by the wake-all that follows every subscription
            code = PUBLISHER.format(channel=keys.JOB_EVENTS_CHANNEL, last=LAST)
            started = time.process_time()
            publisher = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, str(port), str(count), str(batch)
            )
            await asyncio.wait_for(ended.wait(), timeout=120)
            spent = time.process_time() - started
            await asyncio.wait_for(publisher.wait(), timeout=30)
    finally:
        await listener.stop()
        await listener._redis.aclose()
    return spent / (count + 1)


async def _subscribed(url: str) -> None:
    """Until Redis counts the listener's subscription (its messages from then on reach it)."""
    async with aioredis.Redis.from_url(url) as client:
        for _ in range(500):
            if (await client.pubsub_numsub(keys.JOB_EVENTS_CHANNEL))[0][1] >= 1:
                await asyncio.sleep(0.05)  # and the wake-all that follows its confirmation is done
                return
            await asyncio.sleep(0.01)
    raise RuntimeError("the listener never subscribed")


async def measure(url: str, port: int, count: int, rounds: int) -> list[dict[str, Any]]:
    runs = []
    for batch in BATCHES:
        spent: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(rounds):
            for way in WAYS:  # in turn, so that a change in the machine's speed hits both
                spent[way].append(await one_round(url, port, way, count, batch))
        run: dict[str, Any] = {"batch": batch, "messages": count}
        for way in WAYS:
            us = [1e6 * s for s in spent[way]]
            run[way] = {
                "cpu_us_per_message_median": round(statistics.median(us), 2),
                "cpu_us_per_message_max": round(max(us), 2),
                "rounds": [round(u, 2) for u in us],
            }
        run["raw_over_pubsub"] = round(
            run["raw"]["cpu_us_per_message_median"] / run["pubsub"]["cpu_us_per_message_median"], 3
        )
        runs.append(run)
        print(f"B={batch:>2}: raw {run['raw']['cpu_us_per_message_median']:.1f} us, "
              f"redis-py PubSub {run['pubsub']['cpu_us_per_message_median']:.1f} us of CPU a message "
              f"(x{run['raw_over_pubsub']})")  # fmt: skip
    return runs


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    runs = report["runs"]
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    spots = range(len(runs))
    for offset, way in ((-0.2, "raw"), (0.2, "pubsub")):
        axes.bar(
            [i + offset for i in spots], [r[way]["cpu_us_per_message_median"] for r in runs], 0.4, label=way
        )
    axes.set_xticks(list(spots), [f"{r['batch']} a read" for r in runs])
    axes.set(ylabel="listener CPU per message (us)", title="Pub/sub listener, per message")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "pubsub", argv)
    count, rounds = (1_000, 1) if args.quick else (20_000, 5)
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "runs": []}
    with bench_stack("pubsub") as (stack, scratch):
        server = start_redis(stack, scratch / "redis")
        report["runs"] = asyncio.run(measure(server.url, server.port, count, rounds))
    write_report(args.out, "pubsub", report, plot)
    return report


if __name__ == "__main__":
    main()

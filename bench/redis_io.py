"""What the API's Redis I/O costs a request, as its clients see it: the batches written on the
API's own connection (`wire`: api/redis_io/wire.py, the adapter that reads redis-py's private
names) against redis-py's pipelines (`pipelines`: its public API, GENQ_API_REDIS_WIRE=0), and with
--base another checkout's API (e.g. a `git worktree add /tmp/base-h3a 180958b`), in one run.

    python -m bench.redis_io                             # C = 1 and 16, 5 rounds of 3,000 requests
    python -m bench.redis_io --base /tmp/base-h3a        # and that checkout's API beside them
    python -m bench.redis_io --quick                     # C = 1 and 4, 1 round of 300: a smoke test

One `genq api` process per side, all on one Redis and no worker: `POST /v1/jobs` (enqueue: one
script call, "cache": false) and `GET /v1/jobs/{id}` (a queued job: one HGETALL), each as a closed
loop of C keep-alive connections (bench/loadgen.py): C = 1 is the latency one client sees, 16 a
busy API. The sides take turns within each round, so a change in the machine's speed hits all.
Reported per endpoint, C and side, as medians of the rounds: requests/s, p50 and p99 latency (ms),
the server's CPU per request (µs, from /proc); and each side's rate and p50 over `wire`'s: the
private reach stays only while it earns at least 10% on one of them.
Writes <out>/redis_io.json and .png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import (
    BENCH_SETTINGS,
    bench_stack,
    cpu_seconds,
    machine,
    parse_args,
    percentile,
    print_table,
    process_tree,
    ratio,
    run_async,
    start_api,
    start_redis,
    write_report,
)
from bench.gateway import start_base_api
from bench.loadgen import closed_loop, http_request, json_post

BODY = orjson.dumps({"prompt": "Name three rivers.", "max_tokens": 8, "cache": False})
ENDPOINTS = ("enqueue", "get_job")


@dataclass(frozen=True)
class Side:
    name: str
    port: int
    pid: int
    job_path: str

    def request(self, endpoint: str) -> bytes:
        return json_post("/v1/jobs", BODY) if endpoint == "enqueue" else http_request("GET", self.job_path)


def one_round(side: Side, endpoint: str, connections: int, count: int) -> dict[str, float]:
    pids = process_tree(side.pid)
    before = cpu_seconds(pids)
    result = run_async(closed_loop("127.0.0.1", side.port, [side.request(endpoint)] * count, connections))
    spent = cpu_seconds(pids) - before
    latencies = result.latencies_ms()
    if len(latencies) != count:
        raise RuntimeError(f"{side.name}: {count - len(latencies)} of {count} {endpoint} requests failed")
    return {"rate": result.rate(), "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "cpu_us": 1e6 * spent / count}  # fmt: skip


def measure(sides: list[Side], concurrency: Sequence[int], rounds: int, count: int) -> list[dict[str, Any]]:
    runs = []
    for endpoint in ENDPOINTS:
        for connections in concurrency:
            got: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
            for _ in range(rounds):
                for side in sides:  # in turn, so that a change in the machine's speed hits every side
                    got[side.name].append(one_round(side, endpoint, connections, count))
            medians = {name: {key: round(statistics.median(r[key] for r in results), 2) for key in results[0]}
                       for name, results in got.items()}  # fmt: skip
            wire = medians["wire"]
            over = {name: {"rate": ratio(m["rate"], wire["rate"]), "p50": ratio(m["p50_ms"], wire["p50_ms"])}
                    for name, m in medians.items() if name != "wire"}  # fmt: skip
            runs.append(
                {"endpoint": endpoint, "connections": connections, "sides": medians, "over_wire": over}
            )
            sides_text = (f"{name} {m['rate']:,.0f}/s p50 {m['p50_ms']} ms" for name, m in medians.items())
            print(f"{endpoint} C={connections}: " + ", ".join(sides_text))
    return runs


def start_sides(stack: ExitStack, redis_url: str, scratch: Path, base: Path | None) -> list[Side]:
    settings = {**BENCH_SETTINGS, "REDIS_URL": redis_url, "DATA_DIR": str(scratch / "genq"),
                "MODEL": "placeholder-echo"}  # fmt: skip
    started = [
        ("wire", *start_api(stack, "api-wire", settings, scratch)),
        ("pipelines", *start_api(stack, "api-pipelines", {**settings, "API_REDIS_WIRE": "0"}, scratch)),
    ]
    if base is not None:
        started.append(("base", *start_base_api(stack, "api-base", base, settings, scratch, 1)))
    return [
        Side(name, port, service.process.pid, f"/v1/jobs/{queued_job(port)}")
        for name, service, port in started
    ]


def queued_job(port: int) -> str:
    response = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", content=BODY,
                          headers={"Content-Type": "application/json"}, timeout=10)  # fmt: skip
    response.raise_for_status()
    return str(response.json()["id"])


def print_report(report: dict[str, Any]) -> None:
    rows = [[run["endpoint"], run["connections"], name, m["rate"], m["p50_ms"], m["p99_ms"], m["cpu_us"],
             run["over_wire"].get(name, {}).get("rate"), run["over_wire"].get(name, {}).get("p50")]
            for run in report["runs"] for name, m in run["sides"].items()]  # fmt: skip
    print_table("Closed loop, medians of the rounds", ["endpoint", "C", "side", "req/s", "p50 ms", "p99 ms",
                "server µs CPU/req", "rate / wire", "p50 / wire"], rows)  # fmt: skip


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    runs = report["runs"]
    names = list(runs[0]["sides"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    spots = range(len(runs))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        offset = (index - (len(names) - 1) / 2) * width
        for axis, key in zip(axes, ("rate", "p50_ms"), strict=True):
            axis.bar([i + offset for i in spots], [r["sides"][name][key] for r in runs], width, label=name)
    labels = [f"{r['endpoint']}\nC={r['connections']}" for r in runs]
    for axis, title in zip(axes, ("requests/s", "p50 latency (ms)"), strict=True):
        axis.set_xticks(list(spots), labels)
        axis.set(title=title)
        axis.legend()
    figure.suptitle("The API's Redis I/O: its own connection against redis-py's pipelines")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", type=Path, default=None,
                        help="another checkout of genq whose API runs beside this tree's two")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "redis_io", argv, _options)
    concurrency, rounds, count = ((1, 4), 1, 300) if args.quick else ((1, 16), 5, 3_000)
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "python": sys.version.split()[0],
                              "base": None if args.base is None else str(args.base)}  # fmt: skip
    with bench_stack("redis_io") as (stack, scratch):
        redis = start_redis(stack, scratch / "redis")
        sides = start_sides(stack, redis.url, scratch, args.base)
        report["runs"] = measure(sides, concurrency, rounds, count)
    print_report(report)
    write_report(args.out, "redis_io", report, plot)
    return report


if __name__ == "__main__":
    main()

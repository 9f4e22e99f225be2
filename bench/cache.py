"""Response-cache benchmark: a Zipf workload replayed through the API, hit ratio against the ideal.

    python -m bench.cache            # 2,000 distinct prompts, 20,000 requests, s = 1.1 (~1-2 minutes)
    python -m bench.cache --quick    # 100 distinct prompts, 1,000 requests: a smoke test in seconds

Everything is real except the model: a private Redis, a real `genq worker` process running the
placeholder model with no step delay (so a miss costs the queue round trip, not a generation),
and two in-process API replicas (the real app, each with its own level 1) taking requests in
turn, so level 2 answers what the other replica generated or read. Requests go one at a time; a
miss is waited for before the next request, so that, like the ideal cache, every repeat of a
prompt finds it done. Reports the hit ratio by level against the ideal hit ratio of an unbounded
cache on the same trace (1 - distinct / requests), and the server-side p50/p99 latency of a
level-1 hit, a level-2 hit and a miss's submission (time inside the ASGI app, from the call to
the last body byte). Writes <out>/cache.json and <out>/cache.png.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.common import parse_args, percentile, write_report
from cli.redis_server import EmbeddedRedis
from shared.config import Settings

MODEL = "placeholder-echo"
LEVELS = ("l1", "l2", "miss")


@dataclass(frozen=True)
class Sizes:
    distinct: int
    requests: int
    zipf_s: float


FULL = Sizes(2000, 20_000, 1.1)
QUICK = Sizes(100, 1000, 1.1)


def zipf_trace(sizes: Sizes, seed: int = 7) -> list[int]:
    """Prompt indices: rank k is drawn with probability proportional to 1 / k^s."""
    weights = [1 / (rank**sizes.zipf_s) for rank in range(1, sizes.distinct + 1)]
    return random.Random(seed).choices(range(sizes.distinct), weights=weights, k=sizes.requests)


def ideal_hit_ratio(trace: Sequence[int]) -> float:
    """An unbounded cache misses each prompt's first occurrence only."""
    return 1 - len(set(trace)) / len(trace)


class Timed:
    """An ASGI wrapper recording the server-side time of the last request: the whole app
    (`last_ms`) and its submit path alone (`submit_ms`: JobQueue.submit, where the cache works),
    and what answered it (`level`: "l1", "l2" or "miss", as ResponseCache.settle() reports it).

    The level is read from the cache's own bookkeeping of that request, not by scanning the
    Prometheus registry between requests: that scan, in the same process, slowed the next request
    by ~0.4 ms (measured), which a server never pays."""

    def __init__(self, app: Any) -> None:
        self.app: ASGIApp = app
        self.last_ms = 0.0
        self.submit_ms = 0.0
        self.level = "miss"

    def watch_cache(self, cache: Any) -> None:
        settle = cache.settle

        def watched_settle(lookup: Any, submitted: Any) -> Any:
            level = settle(lookup, submitted)
            self.level = level or "miss"
            return level

        cache.settle = watched_settle

    def time_submit(self, queue: Any) -> None:
        submit = queue.submit

        async def timed_submit(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await submit(*args, **kwargs)
            finally:
                self.submit_ms = (time.perf_counter() - started) * 1000

        queue.submit = timed_submit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.last_ms = (time.perf_counter() - started) * 1000

        await self.app(scope, receive, timed_send)


def bench_settings(redis_url: str, data_dir: Path, quick: bool) -> Settings:
    return Settings(
        _env_file=None,
        redis_url=redis_url,
        model=MODEL,
        data_dir=data_dir,
        placeholder_step_s=0.0,
        rate_limit_submit="",
        rate_limit_read="",
        max_queue_length=0,
        worker_metrics_port=0,
        cache_l1_max_entries=(QUICK if quick else FULL).distinct,
        log_level="WARNING",
    )


def start_worker(settings: Settings, log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")} | settings.environment()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    with log_path.open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--concurrency=2"],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    ready = settings.data_dir / f"worker-{process.pid}.ready"
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.05)
    return process


@asynccontextmanager
async def replica(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, Timed]]:
    from api.app import create_app

    app = create_app(settings)
    timed = Timed(app)
    async with app.router.lifespan_context(app):
        timed.time_submit(app.state.queue)
        timed.watch_cache(app.state.cache)
        transport = httpx.ASGITransport(app=timed)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60) as client:
            yield client, timed


async def replay(settings: Settings, trace: Sequence[int]) -> dict[str, list[float]]:
    """Latencies (ms) by what answered each request: `<level>` for the whole app, `<level>_submit`
    for its submit path."""
    latencies: dict[str, list[float]] = {name: [] for level in LEVELS for name in (level, f"{level}_submit")}
    async with replica(settings) as first, replica(settings) as second:
        replicas = (first, second)
        # Warm-up: the fingerprint read and the first requests' one-off costs are not measured.
        await first[0].post("/v1/jobs", json={"prompt": "warm-up", "max_tokens": 4, "cache": False})
        for index, prompt in enumerate(trace):
            client, timed = replicas[index % 2]
            body = {"prompt": f"popular question number {prompt} about the cache", "max_tokens": 8}
            timed.level = "miss"  # a request with no cache key never reaches settle()
            response = await client.post("/v1/jobs", json=body)
            level = timed.level
            latencies[level].append(timed.last_ms)
            latencies[f"{level}_submit"].append(timed.submit_ms)
            if level == "miss":
                job = response.json()
                assert response.status_code == 202, response.text
                done = (await client.get(f"/v1/jobs/{job['id']}", params={"wait": 30})).json()
                assert done["status"] == "succeeded", done
    return latencies


def summarise(sizes: Sizes, trace: Sequence[int], latencies: dict[str, list[float]]) -> dict[str, Any]:
    total = len(trace)
    hit_ratio = {level: len(latencies[level]) / total for level in ("l1", "l2")}
    by_level = {level: len(latencies[level]) for level in LEVELS}
    return {
        "workload": {
            "distinct": sizes.distinct,
            "requests": total,
            "zipf_s": sizes.zipf_s,
            "distinct_seen": len(set(trace)),
        },
        "hit_ratio": {
            **{k: round(v, 4) for k, v in hit_ratio.items()},
            "total": round(sum(hit_ratio.values()), 4),
        },
        "ideal_hit_ratio": round(ideal_hit_ratio(trace), 4),
        "requests_by_level": by_level,
        "latency_ms": {
            level: {
                "count": len(values),
                "p50": _round(percentile(values, 50)),
                "p99": _round(percentile(values, 99)),
            }
            for level, values in latencies.items()
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)  # NaN: nothing measured (JSON null)


def plot(report: dict[str, Any], latencies: dict[str, list[float]], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (ratios, spread) = plt.subplots(1, 2, figsize=(11, 4.2))
    hit = report["hit_ratio"]
    ratios.bar(["level 1", "level 2", "total"], [hit["l1"], hit["l2"], hit["total"]], color="#4c72b0")
    ratios.axhline(report["ideal_hit_ratio"], color="#dd8452", linestyle="--", label="ideal (unbounded)")
    ratios.set(ylabel="hit ratio", ylim=(0, 1), title="Hit ratio")
    ratios.legend()
    names = {"l1": "level-1 hit", "l2": "level-2 hit", "miss": "miss"}
    series = [(f"{names[level]}\n{part}", latencies[level + suffix]) for level in LEVELS
              for part, suffix in (("app", ""), ("submit", "_submit")) if latencies[level]]  # fmt: skip
    spread.boxplot([values for _, values in series], showfliers=False)
    spread.set_xticks(range(1, len(series) + 1), [name for name, _ in series], fontsize=8)
    spread.set(ylabel="ms (server side)", title="Submission latency")
    workload = report["workload"]
    figure.suptitle(f"Zipf s={workload['zipf_s']}: {workload['distinct']} prompts, "
                    f"{workload['requests']} requests; {report['machine']}")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "cache", argv)
    sizes = QUICK if args.quick else FULL
    trace = zipf_trace(sizes)
    with tempfile.TemporaryDirectory(prefix="genq-bench-cache-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", appendonly=False)
        server.start()
        worker = None
        try:
            settings = bench_settings(server.url, Path(tmp) / "genq", args.quick)
            worker = start_worker(settings, Path(tmp) / "worker.log")
            started = time.monotonic()
            # On uvloop, as `genq api` serves (uvicorn picks it when installed).
            latencies = anyio.run(replay, settings, trace, backend_options={"use_uvloop": True})
            elapsed = time.monotonic() - started
        finally:
            if worker is not None:
                worker.kill()
                worker.wait(10)
            server.stop()
    report = summarise(sizes, trace, latencies) | {"quick": args.quick, "replay_s": round(elapsed, 1)}
    print(json.dumps(report, indent=2))
    write_report(args.out, "cache", report, lambda report, path: plot(report, latencies, path))
    return report


if __name__ == "__main__":
    main()

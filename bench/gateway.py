"""Gateway benchmark: the API tier alone (real `genq api`, its own Redis, no worker) against a bare
uvicorn + FastAPI endpoint answering a constant JSON body (bench/bare_app.py), in the same run.

    python -m bench.gateway            # --workers 1 and 2, a rate sweep per endpoint (~7 minutes)
    python -m bench.gateway --quick    # --workers 1, one short step per endpoint: a smoke test
    python -m bench.gateway --base /tmp/base   # and the API of another checkout beside this one

Endpoints: `POST /v1/jobs` (enqueue: a new job each time, "cache": false), a cache hit (POST of a
deterministic prompt whose response one placeholder-echo job put in the cache before the run),
`GET /v1/jobs/{id}` (a queued job), and the bare GET and POST. For each: the most it serves
(wrk, closed loop, 64 connections: the throughput ceiling), then an open-loop sweep at fractions
of that rate (bench/loadgen.py: latency from each request's due time), plus the issue's target
rate for the enqueue. Reports rates as ratios to the bare endpoint of the same method, measured in
the same run, and checks the targets: enqueue sustains 2,350 jobs/s with p99 < 50 ms (the step at
that rate runs five times; the median run decides, and all are reported), and the GET reaches half
the bare ceiling. Each open-loop step also reports the CPU the server, Redis and the load
generator spent per request (from /proc), since on a shared 2-core machine that is what the
latency comes down to. With `--base DIR` (a checkout of an earlier commit, e.g. a `git worktree`),
that checkout's `genq api` runs beside this one on the same Redis, and each of its endpoints
(`<name>@base`) right after this one's, at the same open-loop rates: `x_base` is this code's
ceiling over the base's, and each sweep step's p99 is given for both. Writes <out>/gateway.json
and <out>/gateway.png.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
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
    Service,
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
    start_http,
    start_redis,
    start_worker,
    write_report,
)
from bench.loadgen import closed_loop, http_request, json_post, open_loop

MODEL = "placeholder-echo"
TARGET_ENQUEUE_RATE = 2350.0
TARGET_P99_MS = 50.0
TARGET_GET_RATIO = 0.5
ENQUEUE_BODY = orjson.dumps({"prompt": "Name three rivers.", "max_tokens": 8, "cache": False})
CACHED_BODY = orjson.dumps({"prompt": "bench: a prompt whose answer is cached", "max_tokens": 8})


@dataclass(frozen=True)
class Sizes:
    api_workers: tuple[int, ...]
    #: Open-loop rates, as fractions of the endpoint's wrk maximum.
    fractions: tuple[float, ...]
    step_s: float
    wrk_s: int
    connections: int
    #: Add a step at the issue's target rate to the enqueue sweep...
    target_step: bool
    #: ...and run it this many times in all: one step on a shared VM is one sample of its noise.
    target_runs: int = 1


FULL = Sizes((1, 2), (0.25, 0.5, 0.75, 0.9), 4.0, 4, 64, True, 5)
QUICK = Sizes((1,), (0.5,), 1.0, 1, 16, False)


@dataclass(frozen=True)
class Processes:
    """Whose CPU an open-loop step counts, besides this process (the load generator)."""

    #: The pid leading the server's processes (uvicorn's supervisor and its workers).
    server: int
    #: Redis, for genq's endpoints (None for the bare app, which uses none).
    redis: int | None = None

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by the server, Redis and the load generator."""
        own = os.times()
        return {
            "server": cpu_seconds(process_tree(self.server)),
            "redis": cpu_seconds([self.redis]) if self.redis is not None else 0.0,
            "load_generator": own.user + own.system,
        }


@dataclass(frozen=True)
class Endpoint:
    name: str
    port: int
    method: str
    path: str
    processes: Processes
    body: bytes = b""
    #: The bare endpoint whose rate is this one's ceiling (None: this is a ceiling).
    ceiling: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def request(self) -> bytes:
        if self.method == "POST":
            return json_post(self.path, self.body)
        return http_request(self.method, self.path)


# --- Measuring one endpoint ---------------------------------------------------------------------


def measure_max(endpoint: Endpoint, sizes: Sizes, scratch: Path) -> dict[str, Any]:
    """The most the endpoint serves: wrk when installed, else our closed loop."""
    if shutil.which("wrk") is None:
        count = int(2000 * sizes.wrk_s)
        result = run_async(
            closed_loop("127.0.0.1", endpoint.port, [endpoint.request()] * count, sizes.connections)
        )
        latencies = result.latencies_ms()
        return {"tool": "loadgen closed loop (wrk not installed)", "rate": round(result.rate(), 1),
                "errors": result.completed - len(latencies), **latency_summary(latencies)}  # fmt: skip
    argv = ["wrk", "-t1", f"-c{sizes.connections}", f"-d{sizes.wrk_s}s", "--latency"]
    if endpoint.method == "POST":
        script = scratch / f"{endpoint.name}.lua"
        script.write_text(wrk_script(endpoint.body))
        argv += ["-s", str(script)]
    output = subprocess.run([*argv, endpoint.url], capture_output=True, text=True, check=True).stdout
    return {"tool": "wrk", **parse_wrk(output)}


def wrk_script(body: bytes) -> str:
    return (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = [==[{body.decode()}]==]\n"
    )


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def parse_wrk(output: str) -> dict[str, Any]:
    """Requests/s, latency p50/p99 (ms) and non-2xx count from `wrk --latency` output."""

    def latency(label: str) -> float:
        match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
        if match is None:
            raise ValueError(f"no {label}% line in wrk output:\n{output}")
        return round(float(match.group(1)) * _UNITS_MS[match.group(2)], 2)

    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    socket_errors = re.search(r"Socket errors:.*", output)
    if rate is None:
        raise ValueError(f"no Requests/sec in wrk output:\n{output}")
    return {
        "rate": round(float(rate.group(1)), 1),
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "errors": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(0) if socket_errors else None,
    }


def sweep_point(endpoint: Endpoint, rate: float, sizes: Sizes) -> dict[str, Any]:
    """One open-loop step: rate and latency, and the CPU each process spent per request sent."""
    count = max(1, round(rate * sizes.step_s))
    gc.collect()  # now, so the load generator's own collection before the step is not counted in it
    before = endpoint.processes.cpu_s()
    result = run_async(
        open_loop("127.0.0.1", endpoint.port, [endpoint.request()] * count, rate, sizes.connections)
    )
    after = endpoint.processes.cpu_s()
    latencies = result.latencies_ms()
    return {
        "offered_rate": round(rate, 1),
        "achieved_rate": round(result.rate(), 1),
        "sent": result.sent,
        "ok": len(latencies),
        "errors": result.completed - len(latencies),
        "unfinished": result.unfinished,
        **latency_summary(latencies),
        "cpu_us_per_request": {name: round((after[name] - before[name]) * 1e6 / count) for name in after},
    }


def sustained_rate(sweep: Sequence[dict[str, Any]]) -> float | None:
    """The highest offered rate served in full (≥ 98 %, no errors) with p99 under the target."""
    served = [point["offered_rate"] for point in sweep if _meets(point, point["offered_rate"])]
    return max(served, default=None)


def _meets(point: dict[str, Any], rate: float) -> bool:
    p99 = point["p99_ms"]
    return (
        point["errors"] == 0
        and point["achieved_rate"] >= 0.98 * rate
        and p99 is not None
        and p99 < TARGET_P99_MS
    )


def measure_endpoint(
    endpoint: Endpoint, sizes: Sizes, scratch: Path, rates: Sequence[float] | None = None
) -> dict[str, Any]:
    """Its ceiling, then an open-loop sweep at fractions of it (or at `rates`: another endpoint's)."""
    top = measure_max(endpoint, sizes, scratch)
    if rates is None:
        rates = sorted({round(top["rate"] * fraction, -1) or 10.0 for fraction in sizes.fractions})
        if endpoint.name == "enqueue" and sizes.target_step:
            rates = sorted({*rates, TARGET_ENQUEUE_RATE})
    sweep = [sweep_point(endpoint, rate, sizes) for rate in rates]
    print(f"  {endpoint.name}: max {top['rate']:,.0f}/s (p99 {top['p99_ms']} ms); sweep "
          + ", ".join(f"{p['offered_rate']:,.0f}/s p99 {p['p99_ms']} ms" for p in sweep))  # fmt: skip
    result: dict[str, Any] = {"path": f"{endpoint.method} {endpoint.path}", "max": top, "sweep": sweep,
                              "sustained_rate": sustained_rate(sweep)}  # fmt: skip
    if endpoint.name == "enqueue" and sizes.target_step:
        first = next(p for p in sweep if p["offered_rate"] == TARGET_ENQUEUE_RATE)
        more = [sweep_point(endpoint, TARGET_ENQUEUE_RATE, sizes) for _ in range(sizes.target_runs - 1)]
        runs = [first, *more]
        result["target_runs"] = runs
        print("  enqueue at the target rate, every run: p99 " + ", ".join(f"{p['p99_ms']} ms" for p in runs))
        print("  µs CPU per request (server / Redis / load generator): " + ", ".join(map(_cpu_text, runs)))
    return result


# --- Setting up ---------------------------------------------------------------------------------


def api_settings(redis_url: str, data_dir: Path) -> dict[str, str]:
    return {**BENCH_SETTINGS, "REDIS_URL": redis_url, "DATA_DIR": str(data_dir), "MODEL": MODEL,
            "PLACEHOLDER_STEP_S": "0"}  # fmt: skip


def fill_cache(settings: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Run the cached prompt once through a placeholder worker, then stop both processes."""
    with ExitStack() as stack:
        start_worker(stack, "fill-worker", settings, scratch)
        _, port = start_api(stack, "fill-api", settings, scratch)
        headers = {"Content-Type": "application/json", "Prefer": "wait=30"}
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/jobs", content=CACHED_BODY, headers=headers, timeout=40
        )
        job: dict[str, Any] = response.json()
    return job


def probe_cache(port: int) -> str | None:
    """None when the cached prompt is answered from the cache, else why not."""
    response = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", content=CACHED_BODY,
                          headers={"Content-Type": "application/json"}, timeout=10)  # fmt: skip
    job = response.json()
    if response.status_code == 200 and job.get("cached") is True:
        return None
    return f"the cached prompt answered {response.status_code} with cached={job.get('cached')!r}"


def queued_job_id(port: int) -> str:
    response = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", content=ENQUEUE_BODY,
                          headers={"Content-Type": "application/json"}, timeout=10)  # fmt: skip
    response.raise_for_status()
    return str(response.json()["id"])


def api_endpoints(port: int, processes: Processes, suffix: str = "") -> list[Endpoint]:
    """The API's endpoints on `port` (`suffix` names another checkout's)."""
    job_path = f"/v1/jobs/{queued_job_id(port)}"
    return [
        Endpoint("enqueue" + suffix, port, "POST", "/v1/jobs", processes, ENQUEUE_BODY, "bare_post"),
        Endpoint("cache_hit" + suffix, port, "POST", "/v1/jobs", processes, CACHED_BODY, "bare_post"),
        Endpoint("get_job" + suffix, port, "GET", job_path, processes, ceiling="bare_get"),
    ]


def start_base_api(
    stack: ExitStack, name: str, base: Path, settings: dict[str, str], scratch: Path, workers: int
) -> tuple[Service, int]:
    """`genq api` from the checkout at `base`, with this interpreter (-P: the checkout's modules,
    not the current directory's)."""
    argv = [sys.executable, "-P", "-m", "cli.main", "api", "--workers", str(workers)]
    env = {**service_env(settings), "PYTHONPATH": str(base.resolve())}
    return start_http(stack, name, argv, env, scratch, "/healthz")


def run_config(
    workers: int, settings: dict[str, str], sizes: Sizes, scratch: Path, redis_pid: int, base: Path | None
) -> dict[str, Any]:
    """Every endpoint against `genq api --workers N` (and the base checkout's) and the bare app
    with N workers."""
    print(f"\n--workers {workers}")
    with ExitStack() as stack:
        bare_argv = [sys.executable, "-m", "bench.bare_app", "--workers", str(workers)]
        bare, bare_port = start_http(stack, f"bare-{workers}", bare_argv, service_env({}), scratch, "/")
        api, api_port = start_api(stack, f"api-{workers}", settings, scratch, workers)
        bare_cpu = Processes(bare.process.pid)
        endpoints = [
            Endpoint("bare_get", bare_port, "GET", "/", bare_cpu),
            Endpoint("bare_post", bare_port, "POST", "/", bare_cpu, ENQUEUE_BODY),
            *api_endpoints(api_port, Processes(api.process.pid, redis_pid)),
        ]
        based: dict[str, Endpoint] = {}
        if base is not None:
            base_api, base_port = start_base_api(
                stack, f"base-api-{workers}", base, settings, scratch, workers
            )
            based = {
                e.name.removesuffix(BASE): e
                for e in api_endpoints(base_port, Processes(base_api.process.pid, redis_pid), BASE)
            }
        results: dict[str, Any] = {}
        for endpoint in endpoints:
            results[endpoint.name] = measure_one(endpoint, sizes, scratch, results)
            twin = based.get(endpoint.name)
            if twin is not None and "sweep" in results[endpoint.name]:
                rates = [point["offered_rate"] for point in results[endpoint.name]["sweep"]]
                results[twin.name] = measure_one(twin, sizes, scratch, results, rates)
                compare_to_base(results[endpoint.name], results[twin.name])
    return {"api_workers": workers, "endpoints": results, "targets": check_targets(results)}


#: The suffix of the base checkout's endpoints.
BASE = "@base"


def measure_one(
    endpoint: Endpoint,
    sizes: Sizes,
    scratch: Path,
    results: dict[str, Any],
    rates: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One endpoint's result, with its ratio to its bare ceiling (n/a: a cache that did not hit)."""
    if endpoint.name.startswith("cache_hit"):
        problem = probe_cache(endpoint.port)
        if problem is not None:
            print(f"  {endpoint.name}: n/a ({problem})")
            return {"path": "POST /v1/jobs (cached prompt)", "n/a": problem}
    result = measure_endpoint(endpoint, sizes, scratch, rates)
    if endpoint.ceiling is not None:
        result["ratio_to_ceiling"] = ratio(result["max"]["rate"], results[endpoint.ceiling]["max"]["rate"])
    return result


def compare_to_base(result: dict[str, Any], base: dict[str, Any]) -> None:
    """This code's ceiling over the base's, and both p99s at each rate of the sweep."""
    result["x_base"] = ratio(result["max"]["rate"], base["max"]["rate"])
    result["p99_ms_vs_base"] = [
        {"offered_rate": mine["offered_rate"], "p99_ms": mine["p99_ms"], "base_p99_ms": theirs["p99_ms"]}
        for mine, theirs in zip(result["sweep"], base["sweep"], strict=True)
    ]
    print(f"  x base: {result['x_base']} (ceiling); p99 ms this/base: "
          + ", ".join(f"{p['p99_ms']}/{p['base_p99_ms']}" for p in result["p99_ms_vs_base"]))  # fmt: skip


def check_targets(results: dict[str, Any]) -> dict[str, Any]:
    """The enqueue target counts as met when the median of its runs at the target rate meets it
    (p99 < 50 ms with the rate served); every run is reported."""
    runs = results["enqueue"].get("target_runs", [])
    by_p99 = sorted(runs, key=lambda p: float("inf") if p["p99_ms"] is None else p["p99_ms"])
    median = by_p99[len(by_p99) // 2] if by_p99 else None
    get_ratio = results["get_job"].get("ratio_to_ceiling")
    return {
        "enqueue_at_2350": median,
        "enqueue_2350_runs_meeting": f"{sum(_meets(p, TARGET_ENQUEUE_RATE) for p in runs)} of {len(runs)}",
        "enqueue_2350_with_p99_under_50ms": None if median is None else _meets(median, TARGET_ENQUEUE_RATE),
        "get_ratio_to_ceiling": get_ratio,
        "get_at_least_half_of_ceiling": get_ratio is not None and get_ratio >= TARGET_GET_RATIO,
    }


# --- Output -------------------------------------------------------------------------------------


def print_tables(report: dict[str, Any]) -> None:
    rows, sweep_rows = [], []
    for config in report["configs"]:
        for name, result in config["endpoints"].items():
            if "max" not in result:
                rows.append([config["api_workers"], name, None, None, None, None, None, None])
                continue
            top = result["max"]
            ratios = [result.get("ratio_to_ceiling"), result.get("x_base")]
            rows.append([config["api_workers"], name, top["rate"], *ratios,
                         top["p50_ms"], top["p99_ms"], result["sustained_rate"]])  # fmt: skip
            sweep_rows += [[config["api_workers"], name, p["offered_rate"], p["achieved_rate"], p["p50_ms"],
                            p["p99_ms"], p["errors"] + p["unfinished"], _cpu_text(p)]
                           for p in result["sweep"]]  # fmt: skip
    print_table("Most served (wrk, closed loop)", ["api workers", "endpoint", "req/s", "x ceiling", "x base",
                "p50 ms", "p99 ms", "sustained/s (p99<50ms)"], rows)  # fmt: skip
    print_table("Open-loop sweep", ["api workers", "endpoint", "offered/s", "achieved/s", "p50 ms", "p99 ms",
                "errors", "µs CPU/request: server/Redis/load gen"], sweep_rows)  # fmt: skip
    for config in report["configs"]:
        targets = config["targets"]
        print(f"--workers {config['api_workers']}: enqueue 2,350/s with p99 < 50 ms: "
              f"{targets['enqueue_2350_with_p99_under_50ms']} (median run; runs meeting it: "
              f"{targets['enqueue_2350_runs_meeting']}); GET >= 0.5 x ceiling: "
              f"{targets['get_at_least_half_of_ceiling']} ({targets['get_ratio_to_ceiling']})")  # fmt: skip


def _cpu_text(point: dict[str, Any]) -> str:
    return "{server} / {redis} / {load_generator}".format(**point["cpu_us_per_request"])


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    configs = report["configs"]
    figure, axes = plt.subplots(1, len(configs) + 1, figsize=(5.5 * (len(configs) + 1), 4.4))
    names = list(configs[0]["endpoints"])
    width = 0.8 / len(configs)
    for index, config in enumerate(configs):
        rates = [config["endpoints"][name].get("max", {}).get("rate", 0) for name in names]
        axes[0].bar([i + index * width for i in range(len(names))], rates, width,
                    label=f"--workers {config['api_workers']}")  # fmt: skip
        sweep_axis = axes[index + 1]
        for name in names:
            sweep = config["endpoints"][name].get("sweep", [])
            sweep_axis.plot(
                [p["offered_rate"] for p in sweep], [p["p99_ms"] for p in sweep], "o-", label=name
            )
        sweep_axis.axhline(TARGET_P99_MS, color="grey", linestyle=":", label="50 ms")
        sweep_axis.axvline(TARGET_ENQUEUE_RATE, color="grey", linestyle="--", label="2,350/s")
        sweep_axis.set(xlabel="offered requests/s (open loop)", ylabel="p99 ms", yscale="log",
                       title=f"p99 latency, --workers {config['api_workers']}")  # fmt: skip
        sweep_axis.legend(fontsize=7)
    axes[0].set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(names))], names, rotation=20)
    axes[0].set(ylabel="requests/s", title="Most served (wrk)")
    axes[0].legend()
    figure.suptitle(f"genq API vs bare uvicorn+FastAPI, {report['machine']['cpus']} CPUs (shared, noisy)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base", type=Path, default=None, help="a checkout of another commit: its `genq api` runs beside"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "gateway", argv, _options)
    sizes = QUICK if args.quick else FULL
    report: dict[str, Any] = {"quick": args.quick, "machine": machine(), "sizes": sizes.__dict__,
                              "base": None if args.base is None else str(args.base),
                              "load_tools": {"max": "wrk" if shutil.which("wrk") else "loadgen",
                                             "sweep": "bench/loadgen.py open loop"}}  # fmt: skip
    with bench_stack("gateway") as (stack, scratch):
        redis = start_redis(stack, scratch / "redis")
        settings = api_settings(redis.url, scratch / "genq")
        filled = fill_cache(settings, scratch)
        report["cache_fill_job"] = {"status": filled.get("status"), "cached": filled.get("cached")}
        assert redis.process is not None
        report["configs"] = [
            run_config(workers, settings, sizes, scratch, redis.process.pid, args.base)
            for workers in sizes.api_workers
        ]
    print_tables(report)
    write_report(args.out, "gateway", report, plot)
    return report


if __name__ == "__main__":
    main()

"""What the service benchmarks share: a private Redis, real `genq api` / `genq worker` processes
configured through GENQ_* variables, process CPU and memory from /proc, percentiles, the results
table, and the JSON + PNG report.

Every process a benchmark starts is registered on an ExitStack, so it is stopped however the
benchmark ends; every port comes from the free-port finder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvloop

from cli.redis_server import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
T = TypeVar("T")

#: Settings every benchmarked API runs with: no rate limits, admission bound or per-key bound on
#: held requests (they would measure the limiter, not the path: every benchmark client is one
#: anonymous key, and with the default 100 long-polls per key, 256 waiting clients got 429s they
#: took for answers), no worker metrics port (several workers share a host).
BENCH_SETTINGS = {
    "RATE_LIMIT_SUBMIT": "",
    "RATE_LIMIT_READ": "",
    "MAX_QUEUE_LENGTH": "0",
    "MAX_LONG_POLLS_PER_KEY": "1000000",
    "MAX_STREAMS_PER_KEY": "1000000",
    # The tenant quotas: a gateway run enqueues ~10^5 jobs under one key, past its live-jobs bound.
    "MAX_LIVE_JOBS_PER_KEY": "0",
    "MAX_STORED_BYTES_PER_KEY": "0",
    "WORKER_METRICS_PORT": "0",
    "LOG_LEVEL": "WARNING",
}


def parse_args(
    doc: str | None,
    name: str,
    argv: Sequence[str] | None,
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The options every benchmark takes, --quick and --out, and any `more` of its own."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if more is not None:
        more(parser)
    parser.add_argument("--quick", action="store_true", help="a smoke test of a few seconds")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"folder for {name}.json/png (default: bench/results, "
        "or a temporary folder with --quick, so smoke runs never overwrite the committed results)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix=f"genq-bench-{name}-")) if args.quick else RESULTS
    return args


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop, as uvicorn does: the load generator must not be the slower side."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


# --- Percentiles and reports --------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def latency_summary(latencies_ms: Sequence[float], prefix: str = "") -> dict[str, float | None]:
    """p50/p99/max in ms, rounded; None (JSON null) when nothing was measured."""
    summary: dict[str, float | None] = {}
    for label, q in (("p50", 50.0), ("p99", 99.0), ("max", 100.0)):
        value = percentile(latencies_ms, q)
        summary[f"{prefix}{label}_ms"] = None if math.isnan(value) else round(value, 2)
    return summary


def ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value is not None and base else None


def machine() -> dict[str, Any]:
    """What the numbers were measured on; the load average shows how busy the host was."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(column.ljust(width) for column, width in zip(columns, widths, strict=True)))
    print("  ".join("-" * width for width in widths))
    for row in cells:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_report(
    out: Path, name: str, report: dict[str, Any], plot: Callable[[dict[str, Any], Path], None]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    plot(report, out / f"{name}.png")
    print(f"\nwrote {out / f'{name}.json'} and {out / f'{name}.png'}")


# --- Processes ----------------------------------------------------------------------------------


def service_env(settings: Mapping[str, str]) -> dict[str, str]:
    """This environment without any GENQ_* variable, plus `settings` (names without GENQ_)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GENQ_")}
    env.update({f"GENQ_{name.upper()}": value for name, value in settings.items()})
    env["PYTHONPATH"] = str(ROOT)
    return env


class ServiceExited(RuntimeError):
    """A process we started exited while we waited for it (returncode < 0: killed by a signal)."""

    def __init__(self, name: str, returncode: int, log_tail: str) -> None:
        super().__init__(f"{name} exited {returncode}:\n{log_tail}")
        self.returncode = returncode


@dataclass
class Service:
    """A process we started, its log, and how to stop it."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ServiceExited(self.name, self.process.returncode, self.log_tail())

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after timeout_s (to the whole process group it leads). Short: nothing
        a benchmark started holds anything to keep, and a graceful uvicorn waits for open long-polls."""
        if self.process.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(10)

    def _signal(self, signum: int) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


def start_service(
    stack: ExitStack, name: str, argv: Sequence[str], env: Mapping[str, str], logs: Path
) -> Service:
    """Start argv in its own process group (so stop() reaches uvicorn's worker processes too)."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(argv), env=dict(env), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    service = Service(name, process, log_path)
    stack.callback(service.stop)
    return service


def wait_http(service: Service, url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        service.check_alive()
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{service.name} did not answer {url}:\n{service.log_tail()}")
        time.sleep(0.1)


def start_redis(stack: ExitStack, data_dir: Path) -> EmbeddedRedis:
    server = EmbeddedRedis(data_dir, appendonly=False)
    server.start()
    stack.callback(server.stop)
    return server


def start_http(
    stack: ExitStack, name: str, argv: Sequence[str], env: Mapping[str, str], logs: Path, health: str
) -> tuple[Service, int]:
    """A server taking `--port P` (appended to argv), returned with P once `health` answers."""
    port = free_port()
    service = start_service(stack, name, [*argv, "--port", str(port)], env, logs)
    wait_http(service, f"http://127.0.0.1:{port}{health}")
    return service, port


def start_api(
    stack: ExitStack, name: str, settings: Mapping[str, str], logs: Path, workers: int = 1
) -> tuple[Service, int]:
    """A real `genq api` process with `workers` uvicorn processes (its pid leads them all)."""
    argv = [sys.executable, "-m", "cli.main", "api", "--workers", str(workers)]
    return start_http(stack, name, argv, service_env(settings), logs, "/healthz")


def start_worker(
    stack: ExitStack,
    name: str,
    settings: Mapping[str, str],
    logs: Path,
    timeout_s: float = 180.0,
    args: Sequence[str] = (),
) -> Service:
    """A real `genq worker` process (`args`: e.g. `--queues=webhooks`), returned once it is warmed
    up (its ready file exists)."""
    ready = logs / f"{name}.ready"
    ready.unlink(missing_ok=True)
    env = service_env(
        {**settings, "WORKER_READY_FILE": str(ready), "WORKER_PIDFILE": str(logs / f"{name}.pid")}
    )
    argv = [sys.executable, "-m", "cli.main", "worker", *args]
    service = start_service(stack, name, argv, env, logs)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        service.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready after {timeout_s} s:\n{service.log_tail()}")
        time.sleep(0.05)
    return service


@contextmanager
def bench_stack(name: str) -> Iterator[tuple[ExitStack, Path]]:
    """An ExitStack for the processes and a scratch folder (logs, Redis files) for one run."""
    with tempfile.TemporaryDirectory(prefix=f"genq-bench-{name}-") as scratch, ExitStack() as stack:
        yield stack, Path(scratch)


# --- /proc --------------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (uvicorn with --workers N is a supervisor and N children)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = [pid], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with _ignore_gone():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


def voluntary_switches(pid: int) -> int:
    """How often the threads of process `pid` have given up the CPU to wait (a lock, the GIL, a
    socket's reply): each hand-off of a job between threads, each Redis round trip, counts."""
    total = 0
    with _ignore_gone():
        for thread in Path(f"/proc/{pid}/task").iterdir():
            with _ignore_gone():
                for line in (thread / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
    return total


def rss_mb(pids: Sequence[int]) -> float:
    total_kb = 0
    for pid in pids:
        with _ignore_gone():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


def host_busy_cpu_s() -> float:
    """CPU seconds the whole host has spent busy since boot (/proc/stat: all but idle and iowait, with
    steal); a run's delta minus its own processes' CPU is what everything else took meanwhile."""
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / _TICKS


def _ignore_gone() -> suppress:
    return suppress(FileNotFoundError, ProcessLookupError)

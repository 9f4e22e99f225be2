"""What bench.abuse watches while key A attacks: `/healthz` latency from a process of its own
(every PROBE_INTERVAL_S, as a liveness probe would ask), and the API's and worker's resident
memory, the bytes the API holds in its temporary folder, the file storage's bytes and Redis's
used_memory, sampled every SAMPLE_INTERVAL_S by a thread.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.common import cpu_seconds, latency_summary, process_tree, rss_mb

PROBE_INTERVAL_S = 0.05
SAMPLE_INTERVAL_S = 0.1


def probe_healthz(port: int, duration_s: float, stop: Any, out: str) -> None:
    """The probe process's entry point (multiprocessing, spawn): GET /healthz every
    PROBE_INTERVAL_S until `stop` (an Event) is set or duration_s passed; [seconds since start,
    latency ms, status] to `out` as JSON. A probe with no answer in 5 s counts with status 0."""
    samples: list[tuple[float, float, int]] = []
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    while (now := time.monotonic()) - started < duration_s and not stop.is_set():
        try:
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            status = 0
        samples.append((round(now - started, 3), round((time.monotonic() - now) * 1000, 2), status))
        time.sleep(max(0.0, now + PROBE_INTERVAL_S - time.monotonic()))
    connection.close()
    Path(out).write_text(json.dumps(samples))


def temp_bytes(pids: list[int], folder: str) -> int:
    """Bytes in `folder`: its files, and the deleted-but-open files the processes `pids` hold
    there (a spooled upload is an unlinked temporary file, invisible to a directory walk)."""
    total = sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())
    for pid in pids:
        with suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with suppress(OSError):
                    if os.readlink(fd).startswith(folder) and os.readlink(fd).endswith("(deleted)"):
                        total += fd.stat().st_size
    return total


def folder_bytes(folder: Path) -> int:
    with suppress(OSError):
        return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return 0


@dataclass
class Monitor:
    """Samples (in a thread) until stopped: each sample is [t, api MB, worker MB, temp MB, files
    MB, Redis MB, then the CPU seconds so far of the API, the worker and Redis]; peaks are the
    largest of each measure, CPU percent the CPU seconds' growth over a window."""

    api_pid: int
    worker_pid: int
    redis_pid: int
    temp_dir: str
    files_dir: Path
    redis_url: str
    samples: list[list[float]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="abuse-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            api = process_tree(self.api_pid)
            try:
                used_mb = int(client.info("memory")["used_memory"]) / 2**20
            except redis.RedisError:
                used_mb = float("nan")
            self.samples.append(
                [
                    round(time.monotonic() - self.t0, 2),
                    round(rss_mb(api), 1),
                    round(rss_mb(process_tree(self.worker_pid)), 1),
                    round(temp_bytes(api, self.temp_dir) / 2**20, 1),
                    round(folder_bytes(self.files_dir) / 2**20, 1),
                    round(used_mb, 1),
                    cpu_seconds(api),
                    cpu_seconds(process_tree(self.worker_pid)),
                    cpu_seconds([self.redis_pid]),
                ]
            )
        client.close()

    def peaks(self, window: tuple[float, float] = (0.0, float("inf"))) -> dict[str, float]:
        """The largest of each measure over the samples taken within `window` (s since t0)."""
        names = ["api_rss_mb", "worker_rss_mb", "api_temp_mb", "file_storage_mb", "redis_used_mb"]
        within = [sample for sample in self.samples if window[0] <= sample[0] <= window[1]]
        return {f"{name}_peak": max((s[i + 1] for s in within), default=0.0) for i, name in enumerate(names)}

    def cpu_percent(self, window: tuple[float, float]) -> dict[str, float]:
        """Each process's CPU over `window` (s since t0), in percent of one core."""
        within = [sample for sample in self.samples if window[0] <= sample[0] <= window[1]]
        if len(within) < 2 or within[-1][0] <= within[0][0]:
            return {}
        span = within[-1][0] - within[0][0]
        return {f"{name}_cpu_percent": round((within[-1][i] - within[0][i]) / span * 100, 1)
                for i, name in ((6, "api"), (7, "worker"), (8, "redis"))}  # fmt: skip


def probe_summary(samples: list[list[float]], offset_s: float) -> dict[str, Any]:
    """How many probes, how many were not a 200, their latency, and the slowest of each second
    (at the monitor's time: offset_s is when the probes began) for the plot."""
    slowest: dict[int, float] = {}
    for t, ms, _ in samples:
        slowest[int(t)] = max(ms, slowest.get(int(t), 0.0))
    return {
        "probes": len(samples),
        "not_ok": sum(1 for s in samples if s[2] != 200),
        **latency_summary([sample[1] for sample in samples], "healthz_"),
        "slowest_per_s": [[round(offset_s + t, 1), ms] for t, ms in sorted(slowest.items())],
    }

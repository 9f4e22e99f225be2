"""A real Prometheus for the tests: Debian's `prometheus` package (`make system-tools` installs it
when it can), started on a free port with a scrape config written by the test, scraping every
second. Without the binaries the tests skip and say why."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cli.redis_server import free_port

Vector = list[dict[str, Any]]


def binary(name: str) -> str:
    """Path of `prometheus` or `promtool`, or skip the test saying how to get it."""
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed: `make system-tools` installs Debian's prometheus package "
                    "(as root with apt-get), or install Prometheus 2.x yourself")  # fmt: skip
    return found


def scrape_job(name: str, urls: list[str], **labels: str) -> dict[str, Any]:
    """A scrape job of these http://host:port targets; `labels` as a ServiceMonitor adds them
    (namespace, ...)."""
    targets = [url.removeprefix("http://").rstrip("/") for url in urls]
    return {"job_name": name, "static_configs": [{"targets": targets, "labels": labels}]}


class Prometheus:
    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": scrape_configs,
        }))  # fmt: skip
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = 30.0) -> Prometheus:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def query(self, expr: str) -> Vector:
        """An instant query's result; a query Prometheus cannot parse or run fails the test."""
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert reply["status"] == "success", f"{expr}\n{reply.get('errorType')}: {reply.get('error')}"
        result: Vector = reply["data"]["result"]
        return result

    def wait_for(self, expr: str, done: Callable[[Vector], bool], timeout_s: float = 30.0) -> Vector:
        deadline = time.monotonic() + timeout_s
        while not done(result := self.query(expr)):
            assert time.monotonic() < deadline, f"{expr} never got there: {result}"
            time.sleep(0.25)
        return result

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._log.close()


def value(result: Vector) -> float:
    """The value of a one-sample instant vector."""
    assert len(result) == 1, result
    return float(result[0]["value"][1])

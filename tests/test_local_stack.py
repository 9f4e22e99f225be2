"""`genq up` (what `make run` runs) delivers webhooks, and stops cleanly: Ctrl-C lets the worker
finish the job it runs before Redis stops, so the job ends succeeded, not stuck in `running`; and
a `genq up` killed outright leaves nothing running. Real processes: the stack's own Redis, API,
model worker, webhook worker, Flower."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from cli.redis_server import EmbeddedRedis, free_port
from shared import keys
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

#: The placeholder model takes this long per token: a 20-token job runs for ~4 s.
STEP_S = 0.2


class Stack:
    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.api_port, self.flower_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")}
        env |= {
            "GENQ_DATA_DIR": str(data_dir), "GENQ_MODEL": "placeholder-echo",
            "GENQ_PLACEHOLDER_STEP_S": str(STEP_S), "GENQ_API_PORT": str(self.api_port),
            "GENQ_FLOWER_PORT": str(self.flower_port), "GENQ_WORKER_METRICS_PORT": "0",
            "GENQ_DRAIN_TIMEOUT_S": "30",
            # Only so the test's receiver may listen on loopback; everything else is the default.
            "GENQ_WEBHOOK_ALLOW_PRIVATE": "1",
        }  # fmt: skip
        self._log = log.open("w")
        # Its own process group, as a shell gives a foreground job: Ctrl-C signals the whole group.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up"], env=env, cwd=ROOT, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.log = log

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"genq up not ready:\n{self.log.read_text()[-3000:]}")

    def redis_port(self) -> int:
        for line in self.log.read_text().splitlines():
            if "embedded Redis on redis://127.0.0.1:" in line:
                return int(line.split("127.0.0.1:")[1].split("/")[0])
        raise AssertionError(f"no Redis line in the log:\n{self.log.read_text()[-3000:]}")

    def close(self) -> None:
        # The whole group, even when genq up itself is gone: anything it left is in it or (with
        # the children's own groups) ends with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self._log.close()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    started = Stack(tmp_path / "genq", tmp_path / "up.log")
    yield started
    started.close()


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_closed(ports: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (still := [p for p in ports if listening(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return still


def test_webhooks_are_delivered_on_the_local_stack(stack: Stack) -> None:
    received: list[bytes] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stack.wait_ready()
        hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
        body = {"prompt": "ping", "max_tokens": 2, "webhook": hook}
        job_id = httpx.post(f"{stack.url}/v1/jobs", json=body).json()["id"]
        deadline = time.monotonic() + 60
        while not any(b'"job.completed"' in r for r in received):
            assert time.monotonic() < deadline, f"no delivery:\n{stack.log.read_text()[-3000:]}"
            time.sleep(0.1)
    finally:
        server.shutdown()
    assert job_id.encode() in received[-1]


def test_ctrl_c_lets_the_running_job_finish_before_redis_stops(stack: Stack) -> None:
    stack.wait_ready()
    response = httpx.post(f"{stack.url}/v1/jobs", json={"prompt": "count to twenty", "max_tokens": 20})
    job_id = response.json()["id"]
    deadline = time.monotonic() + 30
    while httpx.get(f"{stack.url}/v1/jobs/{job_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    redis_port = stack.redis_port()

    os.killpg(stack.process.pid, signal.SIGINT)  # Ctrl-C in the terminal running `make run`

    assert stack.process.wait(60) == 0, stack.log.read_text()[-3000:]
    assert wait_closed([stack.api_port, stack.flower_port, redis_port], 5) == []
    # Read what Redis kept (its append-only file) with a server of our own on the same data.
    server = EmbeddedRedis(stack.data_dir / "redis", appendonly=True)
    server.start()
    try:
        record = redis.Redis.from_url(server.url, decode_responses=True).hgetall(keys.job(job_id))
    finally:
        server.stop()
    assert record["status"] == "succeeded", record
    assert record["output"], record


def test_a_killed_genq_up_leaves_nothing_running(stack: Stack) -> None:
    stack.wait_ready()
    ports = [stack.api_port, stack.flower_port, stack.redis_port()]
    stack.process.kill()  # genq up alone, with no chance to stop its children
    stack.process.wait(10)
    assert wait_closed(ports, 30) == [], "children outlived genq up"

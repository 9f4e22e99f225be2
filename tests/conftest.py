"""Real parts for every test: a private Redis-compatible server (the same valkey-server binary
the local stack uses) on a free loopback port, real `genq worker` processes, and the real
FastAPI app (in-process over httpx's ASGI transport, lifespan included)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.config import Settings

for _name in [n for n in os.environ if n.startswith("GENQ_")]:  # the suite is hermetic
    del os.environ[_name]

ROOT = Path(__file__).resolve().parent.parent
TEST_MODEL = "placeholder-echo"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushall()
    yield client
    client.close()


def suite_settings(redis_url: str, data_dir: Path, **overrides: Any) -> Settings:
    """Settings for the suite's processes: the test model, fast heartbeats, no metrics port."""
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "model": TEST_MODEL,
        "data_dir": data_dir,
        "heartbeat_interval_s": 0.5,
        "heartbeat_ttl_s": 3.0,
        "lease_ttl_s": 3.0,
        "reaper_interval_s": 0.5,
        "worker_metrics_port": 0,
        # Limits far above what a test sends; tests/api/edge/test_ratelimit.py sets tight ones.
        "rate_limit_submit": "100000/100000",
        "rate_limit_read": "100000/100000",
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture
def make_settings(redis_server: EmbeddedRedis, tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        url, data_dir = (
            overrides.pop("redis_url", redis_server.url),
            overrides.pop("data_dir", tmp_path / "genq"),
        )
        return suite_settings(url, data_dir, **overrides)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    return make_settings()


@asynccontextmanager
async def api_client(settings: Settings, api_key: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    from api.app import create_app

    app = create_app(settings)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=headers,
                                     timeout=90) as client:  # fmt: skip
            yield client


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")}
    for name, value in settings.model_dump(exclude_none=True).items():
        if isinstance(value, list):
            text = ",".join(value)
        elif isinstance(value, dict):
            text = json.dumps(value)
        elif hasattr(value, "get_secret_value"):
            text = value.get_secret_value()
        else:
            text = str(value)
        env[f"GENQ_{name.upper()}"] = text
    env["PYTHONPATH"] = str(ROOT)
    return env


class WorkerProcess:
    """A real `genq worker` process."""

    def __init__(self, settings: Settings, log_path: Path, *extra: str) -> None:
        self.settings = settings
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", *extra],
            env=settings_env(settings), cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    @property
    def ready_file(self) -> Path:
        return self.settings.data_dir / f"worker-{self.process.pid}.ready"

    def wait_ready(self, timeout_s: float = 120.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"worker exited {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker not ready:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout_s: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(settings: Settings, *extra: str, wait: bool = True) -> WorkerProcess:
        worker = WorkerProcess(settings, tmp_path / f"worker-{len(started)}.log", *extra)
        started.append(worker)
        return worker.wait_ready() if wait else worker

    yield start
    for worker in started:
        worker.close()


@pytest.fixture
def worker(settings: Settings, start_worker: Callable[..., WorkerProcess]) -> WorkerProcess:
    return start_worker(settings)


def assert_nothing_written(client: redis.Redis) -> None:
    """No job record, owner index, idempotency key or queued message exists (rate-limit buckets
    and other bookkeeping may)."""
    written = [k for k in cast(list[str], client.keys("genq*")) if not k.startswith("genq:ratelimit:")]
    assert written == [], written


class ApiProcess:
    """A real `genq api` process on a free loopback port."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        from cli.redis_server import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "api", "--port", str(self.port)],
            env=settings_env(settings), cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.log_path = log_path

    def wait_ready(self, timeout_s: float = 30.0) -> ApiProcess:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(f"{self.url}/healthz")
                return self
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"API did not start:\n{self.log_path.read_text()[-3000:]}") from None
                time.sleep(0.1)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._log.close()


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[[Settings], ApiProcess]]:
    started: list[ApiProcess] = []

    def start(settings: Settings) -> ApiProcess:
        api = ApiProcess(settings, tmp_path / f"api-{len(started)}.log")
        started.append(api)
        return api.wait_ready()

    yield start
    for api in started:
        api.close()


async def wait_until_running(client: redis.Redis, job_ids: list[str], timeout_s: float = 30.0) -> None:
    """Poll the job records until every one of job_ids is running (a worker has claimed it)."""
    deadline = time.monotonic() + timeout_s
    while any(client.hget(f"genq:job:{job_id}", "status") != "running" for job_id in job_ids):
        assert time.monotonic() < deadline, f"jobs never started: {job_ids}"
        await asyncio.sleep(0.02)


async def wait_until_acked(client: redis.Redis, timeout_s: float = 15.0) -> None:
    """Poll until the broker holds no unacknowledged message. A worker acknowledges a job's
    message after the job's end is recorded (late acks), so a job can read `succeeded` a moment
    before its message leaves kombu's unacked hash; one that never leaves it is a leak."""
    deadline = time.monotonic() + timeout_s
    while (left := client.hlen(keys.KOMBU_UNACKED)) != 0:
        assert time.monotonic() < deadline, f"{left} message(s) never acknowledged"
        await asyncio.sleep(0.05)


@contextmanager
def monitored(client: redis.Redis) -> Iterator[list[str]]:
    """Every command the server runs inside the block, as MONITOR shows it."""
    seen: list[str] = []
    watching, end = threading.Event(), f"end-of-watch-{uuid.uuid4().hex}"

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            watching.set()
            for command in monitor.listen():
                seen.append(command["command"])
                if command["command"] == f"ECHO {end}":
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert watching.wait(5)
    yield seen
    client.echo(end)
    watcher.join(5)
    assert not watcher.is_alive()


def commands_while(client: redis.Redis, run: Callable[[], object]) -> list[str]:
    """The commands Redis ran while `run` ran, in order, each as its name and first key, less a new
    connection's greeting (HELLO, CLIENT SETINFO) and monitored()'s end."""
    with monitored(client) as seen:
        run()
    skipped = ("HELLO", "CLIENT", "ECHO END-OF-WATCH-")
    return [" ".join(str(command).split()[:2]) for command in seen if not command.upper().startswith(skipped)]

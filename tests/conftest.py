"""Real parts for every test: a private Redis-compatible server (the same valkey-server binary
the local stack uses) on a free loopback port, real `genq worker` processes, and the real
FastAPI app (in-process over httpx's ASGI transport, lifespan included)."""

from __future__ import annotations

import asyncio
import inspect
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cache
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
# A pytest-xdist worker has COLUMNS=80 and LINES=24 set, which a CLI child's rich would take over
# the size of the pseudo-terminal a test gives it (tests/cli/test_jobs.py).
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

ROOT = Path(__file__).resolve().parent.parent
TEST_MODEL = "placeholder-echo"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


# Cost tiers: every test gets exactly one, derived from what it uses (an explicit mark wins), so
# `pytest -m "unit or redis"` (make check) is the suite that starts no process and loads no model.
# docs/testing.md lists what each tier covers.
TIERS = ("unit", "redis", "processes", "model")
MODEL_FIXTURES = {"default_model", "random_model", "llamacpp_model", "default_engine", "random_engine",
                  "llamacpp_engine", "backend_engine"}  # fmt: skip
PROCESS_FIXTURES = {"start_worker", "worker", "start_api", "start_prometheus"}
# What a test, one of its fixtures or a helper they call (in tests/ or bench/) writes to load a model
# or start a process without one of the fixtures above.
LOADS_MODEL = re.compile(
    r"\bload_(llamacpp_)?model\(|from_pretrained\(|\btokenizer_folder\(|\bFolderTokenizer\(|"
    r"\bbuild_engine\(.*\bDEFAULT_MODEL\b"
)
STARTS_PROCESS = re.compile(
    r"\bsubprocess\.|\bPopen\b|create_subprocess_|\bmultiprocessing\b|\bos\.fork\b|"
    r"\b(WorkerProcess|ApiProcess|EmbeddedRedis|Prometheus)\(|sync_playwright|\bbench_stack\(|"
    # genq's own: a supervised child of `genq up`; the API compiles a JSON schema in a child process.
    r"\bstart_supervised\(|\bSchemaChecker\(|[\"']json_schema[\"']"
)
OURS = ("tests.", "bench.")  # where helpers are followed (not into genq's own code or libraries)
SPAWN_EVENTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec"}


def _ours(target: object) -> types.FunctionType | type | None:
    target = inspect.unwrap(target) if callable(target) else target
    if isinstance(target, (types.FunctionType, type)) and (target.__module__ or "").startswith(OURS):
        return target
    return None


def _source_of(*roots: object) -> str:
    """The source of tests, fixtures and helpers of ours and of the helpers they name, transitively."""
    seen: set[types.FunctionType | type] = set()
    todo = [found for found in map(_ours, roots) if found is not None]
    while todo:
        target = todo.pop()
        if target not in seen:
            seen.add(target)
            todo += _named_by(target)
    return "\n".join(_own_source(target) for target in seen)


@cache
def _own_source(target: types.FunctionType | type) -> str:
    try:
        return inspect.getsource(target)
    except (OSError, TypeError):
        return ""


@cache
def _named_by(target: types.FunctionType | type) -> list[types.FunctionType | type]:
    """Our functions and classes a function names (`helper(...)`, `module.helper(...)`)."""
    if not isinstance(target, types.FunctionType):
        return []
    names, found = _names_in(target.__code__), []
    for name in names:
        value = target.__globals__.get(name)
        if isinstance(value, types.ModuleType):
            found += [getattr(value, n) for n in names if hasattr(value, n)]
        elif value is not None:
            found.append(value)
    return [ours for ours in map(_ours, found) if ours is not None]


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names_in(constant)
    return names


def _tier(item: pytest.Item) -> str:
    used = set(getattr(item, "fixturenames", ()))
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    # redis_server starts the session's one server: that is the redis tier, not a process start.
    own = [defs[-1].func for name, defs in fixtures.items() if defs and name != "redis_server"]
    source = _source_of(getattr(item, "function", None), *own)
    if used & MODEL_FIXTURES or LOADS_MODEL.search(source):
        return "model"
    if used & PROCESS_FIXTURES or STARTS_PROCESS.search(source):
        return "processes"
    return "redis" if "redis_server" in used else "unit"


def _module_scoped(item: pytest.Item) -> bool:
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(defs and defs[-1].scope == "module" for defs in fixtures.values())


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks and xdist reads xdist_group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(_tier(item))
        if _module_scoped(item):  # `make test` (--dist loadgroup) builds a module's stack once
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


class SpawnWatch:
    """The processes started while a unit or redis test runs (None: not watching), from the
    interpreter's audit events (subprocess, fork, spawn, exec), less those of threads an earlier
    test left running (a schema compile process replaced in the background)."""

    def __init__(self) -> None:
        self.seen: list[str] | None = None
        self.earlier: set[int] = set()

    def watch(self, on: bool) -> list[str] | None:
        """Start (on) or stop watching; what was seen since the last start."""
        seen, self.seen = self.seen, [] if on else None
        main = threading.main_thread().ident
        self.earlier = {thread.ident for thread in threading.enumerate() if thread.ident not in (None, main)}
        return seen

    def __call__(self, event: str, args: tuple[object, ...]) -> None:
        if self.seen is not None and event in SPAWN_EVENTS and threading.get_ident() not in self.earlier:
            self.seen.append(f"{event} {str(args[:2])[:200]}")


SPAWNS = SpawnWatch()
sys.addaudithook(SPAWNS)
platform.processor()  # its one `uname -p` child, now, so that no test that asks counts it


@pytest.fixture(autouse=True)
def _tier_holds(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the unit or redis tier that starts a process fails: it belongs in `processes`
    (its source did not say so; mark it `@pytest.mark.processes`)."""
    SPAWNS.watch(any(request.node.get_closest_marker(tier) for tier in ("unit", "redis")))
    yield
    spawned = SPAWNS.watch(False)
    if spawned:
        pytest.fail(f"a {'/'.join(TIERS[:2])}-tier test started a process; mark it processes: {spawned}")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), appendonly=False)
    watching, SPAWNS.seen = SPAWNS.seen, None  # the session's one server, started by its first test
    server.start()
    SPAWNS.seen = watching
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
    return env | settings.environment() | {"PYTHONPATH": str(ROOT)}


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
    and the reaper's lock, which the app's reaper takes on its own schedule, may)."""
    bookkeeping = (keys.PREFIX + ":ratelimit:", keys.REAPER_LOCK)
    written = [k for k in cast(list[str], client.keys("genq*")) if not k.startswith(bookkeeping)]
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

"""The chaos soak's stack: real genq processes under a supervisor that restarts whatever exits (as
Kubernetes would), and the fault injector that makes them exit, restarts Redis and squeezes its
memory. Every process's exit is recorded with whether an injected fault explains it.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from bench.common import ROOT, service_env
from cli.redis_server import EmbeddedRedis

#: Seconds the supervisor waits before restarting a process that exited (a kubelet's first
#: back-off is about this; longer would only stretch every recovery time).
RESTART_DELAY_S = 1.0
#: A SIGTERMed worker that has not exited this long after its drain timeout is SIGKILLed (the
#: pod's termination grace period) and the overrun recorded.
GRACE_MARGIN_S = 10.0
#: The exit status of a worker whose engine failed fatally (workers/runtime.py's FATAL_EXIT;
#: repeated here so the harness does not import the code it judges).
FATAL_EXIT = 70


@dataclass
class Exit:
    name: str
    pid: int | None
    at: float
    code: int | None
    #: The injected fault that explains this exit, or None: an unexpected exit.
    fault: str | None
    #: For an unexpected exit: the fault aimed at the process, if any (it ended otherwise).
    note: str = ""
    log_tail: str = ""
    last_error: str = ""
    #: It exited before it was ready (a start that failed, e.g. while Redis was down): it held no
    #: jobs, and the supervisor's restart is the remedy, as a kubelet's would be.
    while_starting: bool = False


@dataclass
class Managed:
    """One supervised process: how to start it, how to tell it is ready, and its state."""

    name: str
    kind: str  # "api" | "model_worker" | "webhook_worker"
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready_file: Path | None = None
    health_url: str | None = None
    fault_file: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    state: str = "down"  # down -> starting -> up -> (exit) down
    #: (fault kind, exit statuses it explains), set when a fault is aimed at this process.
    expect: tuple[str, frozenset[int]] | None = None
    restart_at: float = 0.0
    term_deadline: float | None = None
    restarts: int = 0
    #: Where this incarnation's output starts in the log (every restart appends to it).
    log_offset: int = 0
    on_up: list[Callable[[float], None]] = field(default_factory=list)

    def spawn(self) -> None:
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self.log_offset = log.tell()
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.state = "starting"

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signum)

    def _own_log(self) -> str:
        """What this incarnation wrote (every restart appends to the same file)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    def log_tail(self, chars: int = 1500) -> str:
        return self._own_log()[-chars:]

    def last_error(self) -> str:
        """The last CRITICAL line of this incarnation's log, else its last ERROR line (the tail alone
        often shows only the tasks that ended after the cause)."""
        lines = self._own_log().splitlines()
        for level in ("CRITICAL", "ERROR"):  # a CRITICAL line names the cause, ERRORs follow it
            found = [line for line in lines if f'"level": "{level}"' in line]
            if found:
                return found[-1][:3000]
        return ""


class Supervisor:
    """Restarts what exited, after RESTART_DELAY_S; marks processes up once they are ready; keeps
    Redis running unless a fault holds it down; records every exit."""

    def __init__(self, redis_server: EmbeddedRedis) -> None:
        self.redis = redis_server
        self.processes: list[Managed] = []
        self.exits: list[Exit] = []
        self.redis_held = False
        self.redis_restarts_unexpected = 0
        self._http = httpx.AsyncClient(timeout=1.0)

    def add(self, managed: Managed) -> None:
        self.processes.append(managed)
        managed.spawn()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.tick()
            await asyncio.sleep(0.2)

    async def tick(self) -> None:
        now = time.time()
        await self._keep_redis(now)
        for managed in self.processes:
            await self._tick_one(managed, now)

    async def _keep_redis(self, now: float) -> None:
        """Redis exits only when a fault stops it; if it exited otherwise, record and restart it."""
        process = self.redis.process
        if self.redis_held or (process is not None and process.poll() is None):
            return
        self.redis_restarts_unexpected += 1
        pid, code = (process.pid, process.returncode) if process is not None else (None, None)
        self.exits.append(Exit("redis", pid, now, code, None))
        self.redis.process = None
        await asyncio.to_thread(self.redis.start)

    async def _tick_one(self, managed: Managed, now: float) -> None:
        process = managed.process
        if managed.state in ("starting", "up") and process is not None and process.poll() is not None:
            self._record_exit(managed, process, now)
        elif managed.term_deadline is not None and now > managed.term_deadline:
            # The drain overran its grace period: SIGKILL, as the kubelet would. The exit that
            # follows is not explained by the fault (a drain must end by itself), so it counts.
            managed.term_deadline, managed.expect = (
                None,
                ("worker_term: drain overran, SIGKILLed", frozenset()),
            )
            managed.signal(signal.SIGKILL)
        if managed.state == "down" and now >= managed.restart_at:
            managed.restarts += 1
            managed.spawn()
        elif managed.state == "starting" and await self._ready(managed):
            managed.state = "up"
            for callback in managed.on_up:
                callback(now)
            managed.on_up.clear()

    def _record_exit(self, managed: Managed, process: subprocess.Popen[bytes], now: float) -> None:
        code, expect = process.returncode, managed.expect
        fault = expect[0] if expect is not None and code in expect[1] else None
        note = expect[0] if expect is not None and fault is None else ""
        tail, error = ("", "") if fault else (managed.log_tail(), managed.last_error())
        starting = managed.state == "starting"
        self.exits.append(Exit(managed.name, process.pid, now, code, fault, note, tail, error, starting))
        if managed.fault_file is not None:
            # An engine fault this incarnation never reached must not kill the next one.
            managed.fault_file.unlink(missing_ok=True)
        managed.expect, managed.term_deadline = None, None
        managed.state, managed.restart_at = "down", now + RESTART_DELAY_S

    async def _ready(self, managed: Managed) -> bool:
        if managed.ready_file is not None:
            return managed.ready_file.exists()
        assert managed.health_url is not None
        try:
            return (await self._http.get(managed.health_url)).status_code == 200
        except httpx.TransportError:
            return False

    def up(self, kind: str) -> list[Managed]:
        """Processes of `kind` that are up and not already the target of a fault."""
        return [m for m in self.processes if m.kind == kind and m.state == "up" and m.expect is None]

    def dead(self) -> list[str]:
        return [m.name for m in self.processes if m.state != "up"]

    async def wait_all_up(self, timeout_s: float) -> list[str]:
        """Let the supervisor bring everything up; the names still not up after timeout_s."""
        deadline = time.time() + timeout_s
        while self.dead() and time.time() < deadline:
            await self.tick()
            await asyncio.sleep(0.2)
        return self.dead()

    def stop_all(self) -> None:
        for managed in self.processes:
            managed.signal(signal.SIGKILL)
            if managed.process is not None:
                managed.process.wait(10)

    async def close(self) -> None:
        await self._http.aclose()


# --- The stack --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    apis: int
    model_workers: int


def worker_managed(
    name: str, kind: str, settings: Mapping[str, str], scratch: Path, queues: str | None
) -> Managed:
    ready = scratch / f"{name}.ready"
    fault = scratch / f"{name}.engine-fatal" if kind == "model_worker" else None
    own = {"WORKER_READY_FILE": str(ready), "WORKER_PIDFILE": str(scratch / f"{name}.pid")}
    if fault is not None:
        own["FAULT_ENGINE_FATAL_FILE"] = str(fault)
    argv = [sys.executable, "-m", "cli.main", "worker", *(["--queues", queues] if queues else [])]
    env = service_env({**settings, **own})
    return Managed(name, kind, argv, env, scratch / f"{name}.log", ready_file=ready, fault_file=fault)


def api_managed(name: str, port: int, settings: Mapping[str, str], scratch: Path) -> Managed:
    argv = [sys.executable, "-m", "cli.main", "api", "--port", str(port), "--workers", "1"]
    return Managed(name, "api", argv, service_env(settings), scratch / f"{name}.log",
                   health_url=f"http://127.0.0.1:{port}/healthz")  # fmt: skip


# --- Faults -----------------------------------------------------------------------------------------

#: Fault kinds and their relative weights when drawn at random.
FAULT_WEIGHTS = {
    "worker_kill": 3.0,
    "worker_term": 2.0,
    "engine_fatal": 2.0,
    "api_kill": 1.5,
    "redis_restart": 1.0,
    "redis_squeeze": 1.0,
}


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    #: When the fault's own action ended (a squeeze lifted, Redis started again).
    ended_at: float | None = None
    #: When the target was whole again (the supervisor saw it ready; Redis answered).
    recovered_at: float | None = None
    note: str = ""

    def as_json(self, t0: float) -> dict[str, Any]:
        def rel(value: float | None) -> float | None:
            return None if value is None else round(value - t0, 3)

        recovery = None if self.recovered_at is None else round(self.recovered_at - self.at, 3)
        return {"kind": self.kind, "target": self.target, "at_s": rel(self.at),
                "ended_at_s": rel(self.ended_at), "recovery_s": recovery, "note": self.note}  # fmt: skip


class Injector:
    """Injects one fault at a time at seeded random moments. The first faults cycle through every
    kind (so even a short run covers each), then kinds are drawn by FAULT_WEIGHTS."""

    def __init__(self, supervisor: Supervisor, seed: int, mean_gap_s: float, drain_timeout_s: float,
                 kinds: list[str]) -> None:  # fmt: skip
        self._supervisor = supervisor
        self._rng = random.Random(seed)
        self._mean_gap_s = mean_gap_s
        self._drain_timeout_s = drain_timeout_s
        self._kinds = kinds
        self._pending = self._rng.sample(kinds, len(kinds))
        self.faults: list[Fault] = []

    async def run(self, until: float) -> None:
        while True:
            await asyncio.sleep(
                min(max(self._rng.expovariate(1 / self._mean_gap_s), 0.3), 4 * self._mean_gap_s)
            )
            if time.time() >= until:
                return
            await self.inject_one()

    def _draw(self) -> str:
        return self._rng.choices(self._kinds, [FAULT_WEIGHTS[k] for k in self._kinds])[0]

    async def inject_one(self) -> None:
        """Inject the next kind of the first cycle (it stays next until it found a live target),
        else a drawn one; a kind with no live target now gives way to another draw."""
        first = [self._pending[-1]] if self._pending else []
        for kind in [*first, *(self._draw() for _ in range(len(self._kinds) * 2))]:
            fault = await self._inject(kind)
            if fault is not None:
                if first and kind == first[0]:
                    self._pending.pop()
                self.faults.append(fault)
                return

    async def _inject(self, kind: str) -> Fault | None:
        if kind.startswith("redis"):
            return await (self._redis_restart() if kind == "redis_restart" else self._redis_squeeze())
        pool = {"api_kill": "api", "engine_fatal": "model_worker"}.get(kind)
        if pool is None:  # worker_kill / worker_term: mostly model workers, sometimes the webhook one
            pool = "webhook_worker" if self._rng.random() < 0.2 else "model_worker"
        targets = self._supervisor.up(pool)
        if not targets:
            return None
        return self._hit(kind, self._rng.choice(targets))

    def _hit(self, kind: str, target: Managed) -> Fault:
        fault = Fault(kind, target.name, time.time())
        target.on_up.append(lambda now: setattr(fault, "recovered_at", now))
        if kind == "worker_term":
            target.expect = (kind, frozenset({0}))
            target.term_deadline = fault.at + self._drain_timeout_s + GRACE_MARGIN_S
            target.signal(signal.SIGTERM)
        elif kind == "engine_fatal":
            assert target.fault_file is not None
            target.expect = (kind, frozenset({FATAL_EXIT}))
            target.fault_file.touch()  # the engine deletes it at its next step and fails fatally
        else:  # worker_kill, api_kill
            target.expect = (kind, frozenset({-signal.SIGKILL}))
            target.signal(signal.SIGKILL)
        fault.ended_at = fault.at
        return fault

    async def _redis_restart(self) -> Fault:
        server = self._supervisor.redis
        fault = Fault("redis_restart", "redis", time.time())
        self._supervisor.redis_held = True
        try:
            await asyncio.to_thread(server.stop)  # SIGTERM: the AOF is flushed on the way out
            fault.ended_at = time.time()
            await asyncio.sleep(self._rng.uniform(0.5, 2.0))
            await asyncio.to_thread(server.start)  # same port, same data dir: the AOF is replayed
            await set_policy(server.url)
        finally:
            self._supervisor.redis_held = False
        fault.recovered_at = time.time()
        return fault

    async def _redis_squeeze(self) -> Fault:
        client = aioredis.Redis.from_url(self._supervisor.redis.url, socket_timeout=5)
        try:
            used = int((await client.info("memory"))["used_memory"])
            limit = used + 32 * 1024  # a few records more, then every write is refused
            fault = Fault("redis_squeeze", "redis", time.time(), note=f"maxmemory {limit} (used {used})")
            await client.config_set("maxmemory", limit)
            await asyncio.sleep(self._rng.uniform(2.0, 5.0))
            await client.config_set("maxmemory", 0)
            fault.ended_at = fault.recovered_at = time.time()
            return fault
        finally:
            await client.aclose()


async def set_policy(url: str) -> None:
    """noeviction, as the shipped manifests set it: a full Redis refuses writes, never drops jobs."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("maxmemory-policy", "noeviction")
    finally:
        await client.aclose()

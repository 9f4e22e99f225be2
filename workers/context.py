"""The worker process's runtime, where its Celery tasks find it. A leaf module: it imports no
other worker module (not even for types: `Runtime` is the small protocol the tasks and signal
handlers use), so tasks, webhooks and the start-up code reach the runtime without importing each
other (no import circle, no global in the start-up module)."""

from __future__ import annotations

import threading
from typing import Protocol

import redis

from shared.config import Settings


class Runtime(Protocol):
    """What tasks and signal handlers need of workers.runtime.WorkerRuntime."""

    settings: Settings
    redis: redis.Redis

    @property
    def inflight(self) -> int: ...

    @property
    def model_id(self) -> str | None: ...

    @property
    def closing(self) -> threading.Event: ...

    def run(self, job_id: str) -> None: ...

    def mark_ready(self) -> None: ...

    def drain(self, timeout_s: float) -> None: ...


_current: list[Runtime] = []


def install(runtime: Runtime) -> None:
    """Make `runtime` this process's (once, at worker start-up)."""
    _current[:] = [runtime]


def runtime() -> Runtime:
    if not _current:
        raise RuntimeError("the worker runtime is not started (run the worker with `genq worker`)")
    return _current[0]

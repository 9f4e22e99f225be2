"""The worker process's runtime, where its Celery tasks find it. A leaf module: it imports no
other worker module at run time, so tasks, webhooks and the start-up code reach the runtime
without importing each other (no import circle, no global in the start-up module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

_current: list[WorkerRuntime] = []


def install(runtime: WorkerRuntime) -> None:
    """Make `runtime` this process's (once, at worker start-up)."""
    _current[:] = [runtime]


def runtime() -> WorkerRuntime:
    if not _current:
        raise RuntimeError("the worker runtime is not started (run the worker with `genq worker`)")
    return _current[0]

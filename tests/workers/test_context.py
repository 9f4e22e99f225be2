"""workers/context.py: a worker process's tasks find the runtime installed at start-up, and a task
run outside a started worker says how to start one instead of failing obscurely."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest

from workers import context
from workers.context import Runtime


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    saved = list(context._current)
    yield
    context._current[:] = saved


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_without_a_runtime_a_task_is_told_to_start_the_worker() -> None:
    context._current.clear()
    with pytest.raises(RuntimeError, match="run the worker with `genq worker`"):
        context.runtime()


def test_the_runtime_installed_last_is_the_one_found() -> None:
    first, second = cast(Runtime, _Named("first")), cast(Runtime, _Named("second"))
    context.install(first)
    assert context.runtime() is first
    context.install(second)
    assert context.runtime() is second and len(context._current) == 1

"""A Redis client whose commands each run on their calling thread's own connection.

A worker's task threads, engine loop, publisher and reaper share one `redis.Redis`, and redis-py
checks a connection out of the pool for every command and back after it (a lock, a `poll()` for
stray bytes, bookkeeping): a cost paid by every single command of every job. Here each thread
keeps one connection of the pool for its single commands (a `single_connection_client` over the
same pool, made at the thread's first command).

What stays as it was: pipelines and pub/sub check connections out of the pool; a failed command
is retried by the connection's own Retry; closing the client disconnects every connection, held
ones too; a thread that ends gives its connection back (its client goes with the thread's
locals); a blocking command holds only its own thread's connection."""

from __future__ import annotations

import threading
from typing import Any

import redis


class ThreadConnections(redis.Redis):
    """redis.Redis, each thread's single commands on a connection of its own (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._threads = threading.local()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        own: redis.Redis | None = getattr(self._threads, "client", None)
        if own is None:
            own = self._threads.client = redis.Redis(connection_pool=self.connection_pool,
                                                     single_connection_client=True)  # fmt: skip
        return own.execute_command(*args, **options)  # type: ignore[no-untyped-call]

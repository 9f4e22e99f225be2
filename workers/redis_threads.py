"""A Redis client whose commands each run on their calling thread's own connection.

A worker's task threads, its engine loop, its publisher and its reaper share one `redis.Redis`.
redis-py checks a connection out of the pool for every command and back after it: its lock, a
`poll()` for stray bytes on the socket, and its bookkeeping cost ~20 us of CPU per command (58-61
against 37-38 us for a script call on a held connection, measured in a loop on this project's
2-core VM), paid by each job's single commands (its claim or take, lease renewals, waits on the
queue) and each webhook attempt's take, in processes whose CPU per job is ~0.5-1.3 ms. Here each
thread keeps one connection of the pool for its single commands (a `single_connection_client`
over the same pool, made at the thread's first command), so none is checked out per command.

What stays as it was: pipelines and pub/sub check connections out of the pool as before (a
pipeline gives its connection back when it is done, which a held one must never be); a failed
command is retried by the connection's own Retry, which closes it and connects again, exactly as
on a pooled connection; closing the client disconnects every connection of the pool, held ones
too. A thread that ends gives its connection back to the pool (its client is dropped with the
thread's locals). Blocking commands (BRPOP with a timeout) hold only their own thread's
connection, as they held a pooled one.
"""

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

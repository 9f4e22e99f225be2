"""A Redis client that proves each Lua script call touches only the keys it declares in KEYS.

Every EVAL/EVALSHA it sends runs as a Redis user whose ACL allows exactly that call's KEYS (set
with ACL SETUSER right before): a command a script runs on any other key fails with Redis's own
NOPERM error, so a test whose scripts go through this client fails on an undeclared key. Redis
checks each command inside a script against the calling user's key patterns (since Redis 6), as a
Cluster checks slots and a key-routing proxy routes by KEYS. Commands other than scripts run as
the default user, and a pipeline's commands run one by one, each script with its own KEYS.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.client

from cli.redis_server import EmbeddedRedis

#: The Redis user script calls run as.
PROBE_USER = "genq-script-keys"
_SCRIPT_CALLS = {"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO"}
_GLOB = re.compile(r"([*?\[\]\\])")
_SPACE = re.compile(r"\s")


def _pattern(key: object) -> str:
    """An ACL pattern matching exactly `key` (ACL rules take no whitespace: `?` stands for it)."""
    text = key.decode() if isinstance(key, bytes) else str(key)
    return "~" + _SPACE.sub("?", _GLOB.sub(r"\\\1", text))


class KeyCheckedRedis(redis.Redis):
    """Runs each script call as PROBE_USER with the call's KEYS as its only keys."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        pool = redis.ConnectionPool.from_url(url, **kwargs)
        super().__init__(connection_pool=pool)
        self._probe = redis.Redis.from_url(url, username=PROBE_USER, password="unused", **kwargs)
        self._allow([])
        #: The SHA1 of every script this client ran.
        self.scripts_run: set[str] = set()

    def _allow(self, keys: list[object]) -> None:
        super().execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", PROBE_USER, "reset", "on", "nopass", "+@all", "&*", *map(_pattern, keys)
        )

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() not in _SCRIPT_CALLS:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        body, count = args[1], int(args[2])
        self._allow(list(args[3 : 3 + count]))
        self.scripts_run.add(body if str(args[0]).upper().startswith("EVALSHA") else _sha1(body))
        return self._probe.execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        return OneByOnePipeline(self, transaction)

    def close(self) -> None:
        self._probe.close()
        super().close()


def _sha1(body: object) -> str:
    text = body.encode() if isinstance(body, str) else bytes(body)  # type: ignore[call-overload]
    return hashlib.sha1(text, usedforsecurity=False).hexdigest()


class OneByOnePipeline(redis.client.Pipeline):
    """A pipeline that, when it holds a script call, sends its commands one at a time through a
    KeyCheckedRedis, in order (each script with its own keys allowed); else it is redis-py's."""

    def __init__(self, client: KeyCheckedRedis, transaction: bool) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, transaction, None)
        self._client = client

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        if not any(str(args[0]).upper() in _SCRIPT_CALLS for args, _ in self.command_stack):
            return super().execute(raise_on_error)
        replies: list[Any] = []
        try:
            for args, options in self.command_stack:
                try:
                    replies.append(self._client.execute_command(*args, **options))
                except redis.exceptions.ResponseError as exc:
                    if raise_on_error:
                        raise
                    replies.append(exc)
        finally:
            self.reset()
        return replies


def checked_client(url: str) -> Iterator[KeyCheckedRedis]:
    """A flushed KeyCheckedRedis (decoding replies), closed after."""
    client = KeyCheckedRedis(url, decode_responses=True)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    """tests/conftest.py's redis_client, each script call allowed only the keys it declares: a test
    module that imports this fixture runs its scripts under the key check."""
    yield from checked_client(redis_server.url)

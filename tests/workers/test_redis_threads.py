"""workers/redis_threads.py against a real Redis server: a thread's commands share its own
connection (Redis's CLIENT ID), threads never share one, one thread's blocking command holds no
other, a thread that ends gives its connection back, pipelines still borrow from the pool, and a
restarted server is reconnected to by the thread's next command (the connection's own Retry)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from cli.redis_server import EmbeddedRedis
from workers.redis_threads import ThreadConnections


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    threads = ThreadConnections.from_url(redis_server.url, decode_responses=True)
    yield threads
    threads.close()


def _in_thread(work: Callable[[], Any]) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(timeout=10)
    return result[0]


def test_a_threads_commands_share_its_own_connection(client: redis.Redis, redis_client: redis.Redis) -> None:
    mine = {client.client_id() for _ in range(5)}
    assert len(mine) == 1
    assert client.register_script("return 1")() == 1
    # The script ran on the thread's connection: its last command, as Redis lists it, is the script.
    (last,) = [entry["cmd"] for entry in redis_client.client_list() if int(entry["id"]) in mine]
    assert last == "evalsha"
    others = {_in_thread(client.client_id) for _ in range(3)}
    assert mine.isdisjoint(others)


def test_a_pipeline_borrows_a_connection_of_the_pool_as_before(client: redis.Redis) -> None:
    mine = client.client_id()
    pipe = client.pipeline(transaction=False)
    pipe.client_id()
    (borrowed,) = pipe.execute()
    assert borrowed != mine
    assert client.client_id() == mine  # the pipeline gave its connection back, not the thread's


def test_one_threads_blocking_command_holds_no_other_thread(client: redis.Redis) -> None:
    client.delete("genq-test:list")
    waiting = threading.Thread(target=lambda: client.brpop(["genq-test:list"], timeout=3))
    waiting.start()
    time.sleep(0.2)  # it is blocked in BRPOP now
    started = time.monotonic()
    assert client.ping() and time.monotonic() - started < 1
    client.rpush("genq-test:list", "x")
    waiting.join(timeout=5)
    assert not waiting.is_alive()


def test_a_thread_that_ends_gives_its_connection_back(client: redis.Redis, redis_client: redis.Redis) -> None:
    before = len(redis_client.client_list())
    for _ in range(20):  # threads come and go: their connections are reused, not piled up
        _in_thread(client.ping)
    # As Redis counts them: the ended threads' connections went back to the pool, one serving all.
    assert len(redis_client.client_list()) <= before + 1


def test_a_restarted_server_is_reconnected_to(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "restart", appendonly=False)
    server.start()
    threads = ThreadConnections.from_url(
        server.url, decode_responses=True, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 8)
    )
    try:
        threads.set("k", "before")
        server.restart(down_s=0.5)
        threads.set("k", "after")  # the held connection broke: retried on a new one
        assert threads.get("k") == "after"
    finally:
        threads.close()
        server.stop()

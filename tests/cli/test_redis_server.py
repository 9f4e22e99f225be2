"""cli/redis_server.py: the embedded server the local stack and the suite run. It answers on its
own loopback port, keeps accepted writes across a restart when appendonly (the local stack's
jobs), starts empty when not (the suite's), and a server that cannot start says where its log is
instead of hanging. Real valkey-server processes."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import redis

from cli.redis_server import EmbeddedRedis, free_port, server_binary


def _client(server: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


def test_free_ports_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert os.access(server_binary(), os.X_OK)


@pytest.mark.parametrize(("appendonly", "kept"), [(True, "v"), (False, None)])
def test_writes_survive_a_restart_only_with_appendonly(
    tmp_path: Path, appendonly: bool, kept: str | None
) -> None:
    server = EmbeddedRedis(tmp_path, appendonly=appendonly)
    server.start()
    try:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = _client(server)
        client.set("k", "v")
        client.close()
        server.restart()
        client = _client(server)
        assert client.get("k") == kept
        client.close()
    finally:
        server.stop()
    assert server.process is None
    server.stop()  # stopping a stopped server is harmless


def test_a_server_that_cannot_start_names_its_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: the server's bind fails, and it exits
        server = EmbeddedRedis(tmp_path, port=taken.getsockname()[1], appendonly=False)
        with pytest.raises(RuntimeError, match=f"see {tmp_path}/server.log"):
            server.start(timeout_s=5)
    assert (tmp_path / "server.log").exists()


def test_a_supervised_server_runs_in_its_own_process_group(tmp_path: Path) -> None:
    """`genq up` stops it last, after the workers drained; a Ctrl-C must not reach it first."""
    server = EmbeddedRedis(tmp_path, appendonly=False, supervised=True)
    server.start()
    try:
        assert server.process is not None and os.getpgid(server.process.pid) == server.process.pid
        assert _client(server).ping()
    finally:
        server.stop()


def test_a_port_held_by_another_redis_is_refused_not_taken_for_ours(tmp_path: Path) -> None:
    """Another server answering PING on the port is not ours: start() says so, and leaves no
    process of its own behind."""
    other = EmbeddedRedis(tmp_path / "other", appendonly=False)
    other.start()
    try:
        server = EmbeddedRedis(tmp_path / "ours", port=other.port, appendonly=False)
        with pytest.raises(RuntimeError, match=f"port {other.port} is held by another Redis server"):
            server.start(timeout_s=5)
        assert server.process is None
        assert _client(other).ping()  # the other server is untouched
    finally:
        other.stop()


def test_a_listener_that_never_answers_fails_within_the_timeout(tmp_path: Path) -> None:
    """Something that accepts connections and never answers: start() gives up at its deadline with
    its own error, not after a socket's default minute with a bare TimeoutError."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        server = EmbeddedRedis(tmp_path, port=silent.getsockname()[1], appendonly=False)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="did not start"):
            server.start(timeout_s=2)
        assert time.monotonic() - started < 10

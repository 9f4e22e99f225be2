"""The real app under a real uvicorn server on a free loopback port, in a thread: for clients that
speak real HTTP (the official openai client, a headless browser). It runs the HTTP protocol that
`genq api` runs (api/edge/uvicorn_adapter.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Literal

import httpx
import redis
import uvicorn
from starlette.types import ASGIApp

from api.edge.uvicorn_adapter import http_protocol
from shared.config import Settings


@contextmanager
def live_server(settings: Settings) -> Iterator[str]:
    """Serves create_app(settings) until the block ends; yields its base URL."""
    from api.app import create_app

    with serve(create_app(settings), lifespan="on") as base_url:
        yield base_url


@contextmanager
def served_model(redis_url: str, tmp: Path, model: str) -> Iterator[str]:
    """A live API and one worker process on `model` over a flushed Redis, response cache off (the
    tests see each generation); yields the API's base URL. A worker takes seconds to start: a
    module of tests shares one."""
    from tests.conftest import WorkerProcess, suite_settings

    redis.Redis.from_url(redis_url).flushall()
    settings = suite_settings(redis_url, tmp / "genq", model=model, cache_enabled=False)
    worker = WorkerProcess(settings, tmp / "worker.log").wait_ready()
    try:
        with live_server(settings) as url:
            yield url
    finally:
        worker.close()


@contextmanager
def serve(app: ASGIApp, lifespan: Literal["on", "off"] = "off") -> Iterator[str]:
    """Serves `app` with genq's HTTP protocol until the block ends; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", timeout_graceful_shutdown=2, lifespan=lifespan, http=http_protocol()
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@asynccontextmanager
async def live_client(settings: Settings, api_key: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client over real TCP to a live server (httpx's ASGI transport buffers whole
    responses, so it cannot show a stream arriving piece by piece)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with live_server(settings) as base_url:
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client:
            yield client

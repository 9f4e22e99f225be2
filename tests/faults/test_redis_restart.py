"""The Redis server restarts (append-only persistence on) while jobs are queued and running:
every accepted job still ends in a terminal state, and the API and worker recover by themselves.

With persistence off a restart empties Redis: every queued message, job record and unacknowledged
message is gone (README, "Reliability"). This test is the AOF configuration the stack ships."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.api.live_server import live_client
from tests.api.routes.test_stream import Event, deltas, read_stream, submit
from tests.conftest import WorkerProcess, api_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@contextlib.contextmanager
def aof_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private Redis with the append-only file on (what the stack ships), stopped at the end."""
    server = EmbeddedRedis(tmp_path / "aof", appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_jobs_survive_a_redis_restart_with_aof(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    with aof_redis(tmp_path) as server:
        settings = make_settings(redis_url=server.url, placeholder_step_s=0.02, heartbeat_ttl_s=30)
        start_worker(settings, "--concurrency=4")
        async with api_client(settings) as api:
            ids = [
                (await api.post("/v1/jobs", json={"prompt": f"r{i}", "max_tokens": 20})).json()["id"]
                for i in range(24)
            ]
            await asyncio.sleep(0.3)  # some run, most wait
            server.restart(down_s=1.0)
            deadline = time.monotonic() + 90
            pending = set(ids)
            while pending and time.monotonic() < deadline:
                for job_id in list(pending):
                    response = await api.get(f"/v1/jobs/{job_id}")
                    if response.status_code == 200 and response.json()["status"] in ("succeeded", "failed"):
                        pending.discard(job_id)
                await asyncio.sleep(0.2)
            assert not pending, f"{len(pending)} accepted jobs never finished"
            statuses = [(await api.get(f"/v1/jobs/{i}")).json()["status"] for i in ids]
        assert statuses == ["succeeded"] * len(ids)


async def test_a_stream_open_while_redis_restarts_ends_in_an_error_event_and_resumes(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """A job's event stream is open when Redis goes down: the stream ends with one `error` event
    of type `unavailable` while Redis is down (its follower, woken when the hubs lose their
    subscriptions, reads and fails), not a hang until the 15-30 s recheck nor a cut connection.
    Once Redis is back, a reconnect with the last event's id gets the rest and `done`: nothing
    missed, nothing twice."""
    with aof_redis(tmp_path) as server:
        settings = make_settings(redis_url=server.url, placeholder_step_s=0.05, heartbeat_ttl_s=30)
        start_worker(settings, "--concurrency=2")
        async with live_client(settings) as live:
            job = await submit(live, " ".join(f"w{i}" for i in range(80)), 80)  # ~4 s of steps
            reading = asyncio.create_task(read_stream(live, job["id"]))
            await asyncio.sleep(1.0)  # some output has been streamed
            restarting = asyncio.create_task(asyncio.to_thread(server.restart, 2.0))
            first = await asyncio.wait_for(reading, 10)
            assert not restarting.done(), "the stream did not end while Redis was down"
            await restarting
            assert first[-1].event == "error" and first[-1].json()["error"]["type"] == "unavailable"
            outputs = [event for event in first if event.event == "output"]
            assert outputs and all(event.id for event in outputs)
            done = await resumed(live, job["id"], outputs)
        assert done["status"] == "succeeded"
        ids = [event.id for event in outputs]
        assert len(set(ids)) == len(ids)  # nothing twice
        assert deltas(outputs) == done["output"]["text"]


async def resumed(live: httpx.AsyncClient, job_id: str, outputs: list[Event]) -> dict[str, Any]:
    """What a client does after an `error` event: reconnect with the last event's id until the
    stream ends in `done` (a Redis just back may still answer LOADING for a moment), adding the
    output events it gets to `outputs`; the job `done` carried."""
    for _ in range(20):
        events = await read_stream(live, job_id, last_event_id=outputs[-1].id)
        outputs += [event for event in events if event.event == "output"]
        if events[-1].event == "done":
            assert sum(event.event == "done" for event in events) == 1
            done: dict[str, Any] = events[-1].json()
            return done
        assert events[-1].json()["error"]["type"] == "unavailable", events[-1].data
        await asyncio.sleep(0.2)
    raise AssertionError("the stream never ended in done")

"""GET /v1/jobs/{id}/stream: Server-Sent Events of one job, against the real app, Redis and workers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import httpx
import pytest
import redis

from api.jobs import follow
from shared import keys
from shared.config import Settings
from tests.api.live_server import live_client
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.anyio

SLOW_PROMPT = " ".join(f"w{i}" for i in range(40))


@dataclass
class Event:
    event: str
    data: str
    id: str | None

    def json(self) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(self.data))


async def events_of(response: httpx.Response) -> AsyncIterator[Event | str]:
    """Parsed SSE events; comment lines come through as their text (e.g. 'ping')."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield line[1:].strip()
        elif line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        elif fields:
            yield Event(fields.get("event", "message"), fields.get("data", ""), fields.get("id"))
            fields = {}


async def read_stream(
    live: httpx.AsyncClient, job_id: str, last_event_id: str | None = None, stop_after: int | None = None
) -> list[Event]:
    """The stream's events to its end (or the first `stop_after` output events, then disconnect)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    found: list[Event] = []
    async with live.stream("GET", f"/v1/jobs/{job_id}/stream", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for event in events_of(response):
            if isinstance(event, str):
                continue
            found.append(event)
            outputs = [e for e in found if e.event == "output"]
            if event.event in ("done", "error") or (stop_after is not None and len(outputs) >= stop_after):
                break
    return found


def deltas(events: list[Event]) -> str:
    return "".join(e.json()["delta"] for e in events if e.event == "output")


async def submit(live: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict[str, Any]:
    response = await live.post("/v1/jobs", json={"prompt": prompt, "max_tokens": max_tokens, "cache": False})
    assert response.status_code == 202, response.text
    return cast(dict[str, Any], response.json())


@pytest.fixture
async def live(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with live_client(settings) as client:
        yield client


@pytest.fixture
def slow_settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    return make_settings(placeholder_step_s=0.05)


async def test_a_live_stream_carries_the_output_then_done(
    live: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    job = await submit(live, "one two three four five", 8)
    events = await read_stream(live, job["id"])
    assert [e.event for e in events][-1] == "done"
    assert sum(e.event == "done" for e in events) == 1
    done = events[-1].json()
    assert done["status"] == "succeeded"
    assert done == (await live.get(f"/v1/jobs/{job['id']}")).json()
    assert deltas(events) == done["output"]["text"] == "one two three four five one two three"
    outputs = [e for e in events if e.event == "output"]
    assert all(e.id for e in outputs)
    assert [e.json()["tokens"] for e in outputs] == sorted(e.json()["tokens"] for e in outputs)


async def test_late_join_while_running_gets_all_text_so_far(
    slow_settings: Settings, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(slow_settings)
    async with live_client(slow_settings) as live:
        job = await submit(live, SLOW_PROMPT, 30)
        # Join once part of the output exists: the first events replay it, then live ones follow.
        for _ in range(200):
            if (await live.get(f"/v1/jobs/{job['id']}")).json()["status"] == "running":
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.4)
        events = await read_stream(live, job["id"])
    done = events[-1].json()
    assert done["status"] == "succeeded"
    assert deltas(events) == done["output"]["text"] == " ".join(SLOW_PROMPT.split()[:30])


async def test_late_join_after_the_job_finished(live: httpx.AsyncClient, worker: WorkerProcess) -> None:
    job = await submit(live, "alpha beta gamma", 5)
    finished = (await live.get(f"/v1/jobs/{job['id']}", params={"wait": 20})).json()
    assert finished["status"] == "succeeded"
    events = await read_stream(live, job["id"])
    assert deltas(events) == finished["output"]["text"]
    assert events[-1].event == "done" and events[-1].json() == finished


async def test_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(
    slow_settings: Settings, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(slow_settings)
    async with live_client(slow_settings) as live:
        job = await submit(live, SLOW_PROMPT, 30)
        first = await read_stream(live, job["id"], stop_after=2)
        assert [e.event for e in first] == ["output", "output"]
        rest = await read_stream(live, job["id"], last_event_id=first[-1].id)
    done = rest[-1].json()
    assert done["status"] == "succeeded"
    ids = [e.id for e in first + rest if e.event == "output"]
    assert len(ids) == len(set(ids))
    assert deltas(first) + deltas(rest) == done["output"]["text"]


async def test_resuming_after_the_last_event_sends_only_done(
    live: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    job = await submit(live, "a b c", 3)
    events = await read_stream(live, job["id"])
    last_output = [e for e in events if e.event == "output"][-1]
    again = await read_stream(live, job["id"], last_event_id=last_output.id)
    assert [e.event for e in again] == ["done"]


async def test_cancel_during_a_stream_ends_it_with_a_canceled_job(
    slow_settings: Settings, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(slow_settings)
    async with live_client(slow_settings) as live:
        job = await submit(live, SLOW_PROMPT, 200)
        seen: list[Event] = []
        async with live.stream("GET", f"/v1/jobs/{job['id']}/stream") as response:
            async for event in events_of(response):
                if not isinstance(event, Event):
                    continue
                seen.append(event)
                if sum(e.event == "output" for e in seen) == 1:
                    assert (await live.post(f"/v1/jobs/{job['id']}/cancel")).json()["status"] == "canceled"
                if event.event in ("done", "error"):
                    break
    assert seen[-1].event == "done"
    assert seen[-1].json()["status"] == "canceled"
    assert len(deltas(seen).split()) < 200


async def test_a_job_that_finished_without_stream_entries_sends_its_text_as_one_output(
    live: httpx.AsyncClient, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    job = await submit(live, "cached answer here", 3)
    finished = (await live.get(f"/v1/jobs/{job['id']}", params={"wait": 20})).json()
    assert finished["status"] == "succeeded"
    redis_client.delete(keys.job_stream(job["id"]))  # as for a cache hit: no worker ever streamed it
    events = await read_stream(live, job["id"])
    assert [e.event for e in events] == ["output", "done"]
    assert events[0].json() == {"delta": "cached answer here", "tokens": 3}
    assert events[0].id == follow.FINAL_ID
    assert [e.event for e in await read_stream(live, job["id"], last_event_id=follow.FINAL_ID)] == ["done"]


async def test_unknown_and_others_jobs_get_a_404_before_any_stream(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["key-a", "key-b"])
    async with live_client(settings, "key-a") as alice, live_client(settings, "key-b") as bob:
        job = await submit(alice, "mine", 2)
        for client, job_id in ((alice, "no-such-job"), (bob, job["id"])):
            response = await client.get(f"/v1/jobs/{job_id}/stream")
            assert response.status_code == 404
            assert response.json()["error"]["type"] == "not_found"
        response = await alice.get(f"/v1/jobs/{job['id']}/stream", headers={"Last-Event-ID": "nonsense"})
        assert response.status_code == 422
        assert response.json()["error"]["param"] == "Last-Event-ID"


async def test_an_idle_stream_sends_heartbeats_and_an_error_when_the_job_vanishes(
    live: httpx.AsyncClient, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "HEARTBEAT_S", 0.3)
    job = await submit(live, "nobody runs this", 3)  # no worker: it stays queued
    seen: list[Event | str] = []
    async with live.stream("GET", f"/v1/jobs/{job['id']}/stream") as response:
        async for event in events_of(response):
            seen.append(event)
            if event == "ping" and seen.count("ping") == 2:
                redis_client.delete(keys.job(job["id"]))
            if isinstance(event, Event):
                break
    assert seen.count("ping") >= 2
    last = seen[-1]
    assert isinstance(last, Event) and last.event == "error"
    assert last.json()["error"]["type"] == "not_found"

"""A response_format's JSON schema is compiled only for a caller the API has authenticated, in a
compile process within a time budget (the event loop serves meanwhile), and once per distinct
schema, a batch's at its validation only: over real HTTP against the live app
(api/jobs/schema_compile.py, api/batches/line_schemas.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis

from api.app import create_app
from api.jobs.schema_compile import SchemaChecker
from shared import structured
from shared.config import Settings
from tests.api.jobs.test_schema_compile import costly_schema
from tests.api.live_server import serve
from tests.api.routes.test_batches import chat_line, results, start_batch, wait_for
from tests.api.routes.test_openai import client_for
from tests.conftest import TEST_MODEL, WorkerProcess

pytestmark = pytest.mark.anyio

KEY = "sk-schema-compile-test-7d1e"


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "costly", "schema": schema}}


@contextmanager
def live_app(settings: Settings) -> Iterator[tuple[str, SchemaChecker]]:
    """The app under a live server: its base URL and its schema checker (whose counters say what
    was compiled)."""
    app = create_app(settings)
    with serve(app, lifespan="on") as base_url:
        yield base_url, app.state.schema_checker


@pytest.fixture
def compiled_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every schema this test process compiles itself (the API's compiles run in compile
    processes, not here)."""
    seen: list[str] = []
    grammar = structured.grammar

    def counted(schema: str) -> str:
        seen.append(schema)
        return grammar(schema)

    monkeypatch.setattr(structured, "grammar", counted)
    return seen


def submissions(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every way a job with this schema is asked for: (path, body)."""
    fmt = response_format(schema)
    messages = [{"role": "user", "content": "hi"}]
    return [
        ("/v1/jobs", {"prompt": "hi", "response_format": fmt}),
        ("/v1/chat/completions", {"model": TEST_MODEL, "messages": messages, "response_format": fmt}),
        ("/v1/completions", {"model": TEST_MODEL, "prompt": "hi", "response_format": fmt}),
    ]


@pytest.mark.parametrize("hot_paths", [True, False])
async def test_without_a_key_a_costly_schema_is_refused_uncompiled(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed Redis: no other test's batches for the feeder
    compiled_here: list[str],
    hot_paths: bool,
) -> None:
    settings = make_settings(api_keys=KEY, api_hot_paths=hot_paths)
    with live_app(settings) as (base_url, checker):
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as anonymous:
            for path, body in submissions(costly_schema("anonymous")):
                response = await anonymous.post(path, json=body)
                assert response.status_code == 401, (path, response.text)
                bad_key = await anonymous.post(path, json=body, headers={"Authorization": "Bearer nope"})
                assert bad_key.status_code == 401, (path, bad_key.text)
        assert checker.compiles == 0 and compiled_here == []
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as keyed:  # the counter counts
            path, body = submissions({"type": "array", "items": {"type": "string"}})[0]
            accepted = await keyed.post(path, json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert accepted.status_code == 202, accepted.text
        assert checker.compiles == 1 and compiled_here == []


async def test_a_compile_over_its_time_budget_is_refused_while_the_api_serves(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed Redis: no other test's batches for the feeder
) -> None:
    settings = make_settings(api_keys=KEY, schema_compile_timeout_s=0.25, schema_compiles_per_key=0)
    headers = {"Authorization": f"Bearer {KEY}"}
    with live_app(settings) as (base_url, checker):
        async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=headers) as client:
            answered: list[str] = []

            async def submit(tag: str) -> httpx.Response:
                body = {"prompt": "hi", "response_format": response_format(costly_schema(tag))}
                response = await client.post("/v1/jobs", json=body)
                answered.append(tag)
                return response

            # One compile process: three compiles over budget take turns, each killed in its turn.
            tasks = [asyncio.create_task(submit(f"overrun{i}")) for i in range(3)]
            deadline = time.monotonic() + 30  # a bound on the wait, not a measurement
            while checker.compiles == 0:  # the first compile has started
                assert time.monotonic() < deadline, "no compile started"
                await asyncio.sleep(0.01)
            health = await client.get("/healthz")
            answered.append("healthz")
            responses = await asyncio.gather(*tasks)
    assert health.status_code == 200
    assert answered.index("healthz") < len(answered) - 1, answered  # served while compiles ran
    for response in responses:
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request" and error["param"] == "response_format"
        assert "too complex to compile within 0.25 s" in error["message"]
    assert checker.compiles == 3 and checker.overruns == 3


@pytest.mark.serial  # its costly schema must compile within the time budget: it needs the CPU
async def test_a_key_with_a_compile_in_flight_gets_429_naming_response_format(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed Redis: no other test's batches for the feeder
) -> None:
    other = KEY + "-other"
    settings = make_settings(api_keys=f"{KEY},{other}", schema_compile_workers=2)
    with live_app(settings) as (base_url, checker):
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:

            def post(key: str, path: str, body: dict[str, Any]) -> Any:
                return client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})

            first = asyncio.create_task(post(KEY, *submissions(costly_schema("in-flight"))[0]))
            deadline = time.monotonic() + 30  # a bound on the wait, not a measurement
            while checker.compiles == 0:  # the first compile has started
                assert time.monotonic() < deadline, "no compile started"
                await asyncio.sleep(0.01)
            refusals = [await post(KEY, path, body) for path, body in submissions(costly_schema("second"))]
            others = await post(other, *submissions(costly_schema("other"))[0])
            assert (await first).status_code == 202
    for response in refusals:
        assert response.status_code == 429, response.text
        assert response.headers["Retry-After"] == "1"
        error = response.json()["error"]
        assert error["param"] == "response_format" and "in flight" in error["message"]
    assert refusals[0].json()["error"]["type"] == "rate_limited"  # genq's shape; OpenAI's below
    assert refusals[1].json()["error"]["code"] == "rate_limit_exceeded"
    assert others.status_code == 202, others.text
    assert checker.compiles == 2


async def test_a_repeated_schema_is_compiled_once(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=KEY)
    headers = {"Authorization": f"Bearer {KEY}"}
    good = response_format({"type": "object", "properties": {"city": {"type": "string"}}})
    bad = response_format({"type": "object", "properties": {"city": {"type": "strin"}}})
    with live_app(settings) as (base_url, checker):
        async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as client:
            for _ in range(2):
                accepted = await client.post("/v1/jobs", json={"prompt": "hi", "response_format": good})
                assert accepted.status_code == 202, accepted.text
            assert checker.compiles == 1
            for _ in range(2):  # a refusal is remembered too
                refused = await client.post("/v1/jobs", json={"prompt": "hi", "response_format": bad})
                assert refused.status_code == 422, refused.text
                assert refused.json()["error"]["param"] == "response_format"
                assert "cannot be enforced: Invalid type: strin" in refused.json()["error"]["message"]
            assert checker.compiles == 2


def test_a_batch_compiles_each_schema_once_at_validation_and_the_feeder_none(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed Redis: no other test's batches for the feeder
    start_worker: Callable[..., WorkerProcess],
    compiled_here: list[str],
) -> None:
    # No verdict cache: a compile anywhere after validation (the feeder) would count again.
    settings = make_settings(api_keys=KEY, schema_cache_entries=0, batch_feeder_interval_s=0.05)
    good = response_format({"type": "object", "properties": {"city": {"type": "string"}}})
    bad = response_format({"type": "object", "properties": {"city": {"type": "strin"}}})
    content = b"".join(
        [chat_line(f"good-{i}", "hi", response_format=good) for i in range(4)]
        + [chat_line(f"bad-{i}", "hi", response_format=bad) for i in range(2)]
    )
    start_worker(settings)
    with live_app(settings) as (base_url, checker):
        client = client_for(base_url, KEY)
        done = wait_for(client, start_batch(client, content).id, {"completed", "failed"})
        errors = results(client, done.error_file_id) | results(client, done.output_file_id)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.total == 6
    assert checker.compiles == 2 and compiled_here == []  # one per distinct schema, none by the feeder
    for custom_id in ("bad-0", "bad-1"):
        error = errors[custom_id]["error"]
        assert error["code"] == "invalid_request"
        assert "response_format: the JSON schema cannot be enforced: Invalid type: strin" in error["message"]
    for custom_id in ("good-0", "good-3"):  # fed as jobs (the placeholder model then fails them)
        assert errors[custom_id]["response"]["request_id"]

"""api/app.py: what the app factory promises an operator. Start-up refuses bad settings before
serving anything; the lifespan opens its services and background work (events reader, stream hub,
batch feeder, reaper) and closes every one of them on shutdown; the settings that shape the app
(hot paths, anonymous guard, header timeout, body limits) are honoured. (That a route bypassing the
pipeline, or a dependency the hot path skips, stops start-up is tests/api/edge/test_pipeline.py's
and tests/api/routes/test_hotpath.py's.)"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable

import pydantic
import pytest
import redis

from api.app import GC_YOUNG_THRESHOLD, create_app
from api.edge.pipeline import caller_owner
from api.edge.uvicorn_adapter import HeaderTimeoutProtocol
from cli.redis_server import free_port
from shared.config import Settings
from shared.jobqueue import scripts
from tests.conftest import api_client

pytestmark = pytest.mark.anyio


def connections(client: redis.Redis) -> int:
    """Clients connected to the suite's Redis (this test's own included)."""
    return len(client.client_list())


def background() -> set[str]:
    """The app's background work running now: the feeder task and the reaper thread."""
    tasks = {task.get_name() for task in asyncio.all_tasks()}
    threads = {thread.name for thread in threading.enumerate()}
    return {name for name in tasks | threads if name in ("genq-batch-feeder", "genq-reaper")}


async def test_the_lifespan_closes_everything_it_opened(
    settings: Settings, redis_client: redis.Redis
) -> None:
    """An API process that restarts (uvicorn --reload, a test suite, a rolling deploy) leaks no
    connections, task or thread, and leaves the cyclic GC as it found it."""
    app = create_app(settings)
    before = connections(redis_client)
    thresholds = gc.get_threshold()
    async with app.router.lifespan_context(app):
        assert background() == {"genq-batch-feeder", "genq-reaper"}
        assert await app.state.redis.ping()
        assert connections(redis_client) > before
        assert gc.get_freeze_count() > 0  # start-up's objects are kept out of the cyclic GC's passes
        # Requests in flight do not set off a young-generation pass every few dozen jobs.
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *thresholds[1:])
    assert background() == set()
    assert connections(redis_client) == before
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds


async def test_the_lifespan_loads_the_job_scripts(settings: Settings, redis_client: redis.Redis) -> None:
    """The first submission after a start (or a SCRIPT FLUSH) pays no NOSCRIPT reply, load and retry."""
    shas = [redis_client.register_script(scripts.source(name)).sha for name in ("submit", "cancel")]
    redis_client.script_flush()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        assert redis_client.script_exists(*shas) == [True, True]


async def test_an_api_started_while_redis_is_down_still_starts(
    make_settings: Callable[..., Settings],
) -> None:
    """The scripts are then loaded on first use instead (NOSCRIPT), as after a Redis restart."""
    app = create_app(make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    async with app.router.lifespan_context(app):
        assert app.state.queue is not None


async def test_an_api_without_a_redis_url_stops_at_start_up(make_settings: Callable[..., Settings]) -> None:
    app = create_app(make_settings(redis_url=None))
    with pytest.raises(SystemExit, match="GENQ_REDIS_URL is not set"):
        async with app.router.lifespan_context(app):
            pass


def test_bad_settings_stop_the_factory_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """`uvicorn --factory api.app:create_app` reads the environment: a bad value fails the process."""
    monkeypatch.setenv("GENQ_MAX_BODY_BYTES", "10")
    with pytest.raises(pydantic.ValidationError, match="max_body_bytes"):
        create_app()


@pytest.mark.parametrize("hot_paths", [True, False])
async def test_the_hot_path_setting_is_honoured(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, hot_paths: bool
) -> None:
    """With FastAPI's caller dependency broken, a submission succeeds only where the hot path
    answers it (it asks serve()'s caller itself)."""

    def broken() -> str:
        raise RuntimeError("FastAPI dependency reached")

    async with api_client(make_settings(api_hot_paths=hot_paths)) as api:
        api._transport.app.dependency_overrides[caller_owner] = broken  # type: ignore[attr-defined]
        if hot_paths:
            assert (await api.post("/v1/jobs", json={"prompt": "hot"})).status_code == 202
        else:
            with pytest.raises(RuntimeError, match="FastAPI dependency reached"):
                await api.post("/v1/jobs", json={"prompt": "routed"})


def test_the_header_timeout_reaches_uvicorns_protocol(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HeaderTimeoutProtocol, "header_timeout_s", HeaderTimeoutProtocol.header_timeout_s)
    create_app(make_settings(api_header_timeout_s=2.5))
    assert HeaderTimeoutProtocol.header_timeout_s == 2.5


async def test_an_anonymous_api_answers_its_own_hosts_only(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """DNS rebinding: without API keys another name for this address gets 403; with keys the
    Bearer key is the protection, whatever the Host."""
    foreign = {"host": "attacker.example"}
    async with api_client(make_settings()) as anonymous:
        assert (await anonymous.get("/v1/jobs", headers=foreign)).status_code == 403
        assert (await anonymous.get("/v1/jobs")).status_code == 200
    async with api_client(make_settings(api_keys=["the-key"]), "the-key") as keyed:
        assert (await keyed.get("/v1/jobs", headers=foreign)).status_code == 200


async def test_bodies_are_bounded_with_more_room_for_file_uploads(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    # With a key: an anonymous API takes no uploads at all (api/edge/anonymous.py).
    settings = make_settings(api_keys=["the-key"], max_body_bytes=2048, file_max_bytes=8192)
    line = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    upload = {"file": ("in.jsonl", line * (4096 // len(line)), "application/jsonl")}
    async with api_client(settings, "the-key") as api:
        assert (await api.post("/v1/jobs", json={"prompt": "x" * 4096})).status_code == 413
        response = await api.post("/v1/files", files=upload, data={"purpose": "batch"})
        assert response.status_code == 200, response.text


async def test_the_playground_and_its_static_files_are_served(settings: Settings) -> None:
    async with api_client(settings) as api:
        for path in ("/", "/static/app.js", "/static/app.css"):
            assert (await api.get(path)).status_code == 200, path

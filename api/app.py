"""The API's app factory: settings in, FastAPI app out. `uvicorn --factory api.app:create_app`."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI

from api.batches.feeder import BatchFeeder
from api.batches.files import Files
from api.batches.filestore import storage_from_settings
from api.batches.service import Batches
from api.edge.anonymous import AnonymousGuard
from api.edge.asgi import Linger
from api.edge.errors import install_error_handlers
from api.edge.limits import MULTIPART_OVERHEAD, BodySizeLimit
from api.edge.observability import HttpMetrics
from api.edge.pipeline import check_routes
from api.edge.ratelimit import RateLimiter
from api.edge.uvicorn_adapter import HeaderTimeoutProtocol
from api.jobs.cache import ResponseCache
from api.jobs.events import JobEvents
from api.jobs.queue import JobQueue
from api.jobs.queue_stats import QueueStatsReader
from api.jobs.schema_compile import CompileBudget, SchemaChecker
from api.jobs.store import JobStore, OwnerBounds
from api.jobs.stream_hub import StreamHub
from api.jobs.streams import OutputStreams
from api.redis_io.client import listener_client, redis_client, sync_redis_client
from api.redis_io.commands import Commands, open_commands
from api.routes import batches, files, jobs, openai, ops, playground, stream, webhooks
from api.routes.hotpath import HotPaths, HotRoutes
from shared import keys
from shared.batches import BatchStore
from shared.config import Settings
from shared.files import FileRecords
from shared.jobqueue.reaper import Reaper
from shared.logging import configure_logging, fields

#: The cyclic GC's youngest-generation threshold while the API serves (CPython's default: 700).
#: Each request in flight holds some tens of container objects, so at the default a pass that
#: walks all of them ran every few dozen jobs, a cost per job that grew with concurrency; cycles
#: are still collected, in rare short passes. Chosen from bench/machinery.py runs.
GC_YOUNG_THRESHOLD = 10_000


def bounds_of(settings: Settings) -> Callable[[str], OwnerBounds]:
    """Each key's bounds on what it keeps in the store (GENQ_MAX_*_PER_KEY, or its override)."""

    def bounds(owner: str) -> OwnerBounds:
        return OwnerBounds(
            settings.owner_bound(owner, "live_jobs"), settings.owner_bound(owner, "stored_bytes")
        )

    return bounds


@contextmanager
def running_reaper(settings: Settings) -> Iterator[Reaper]:
    """The reaper on a thread of this process, with a blocking client of its own."""
    client = sync_redis_client(settings)
    reaper = Reaper.from_settings(client, settings)
    reaper.start()
    try:
        yield reaper
    finally:
        reaper.stop()
        client.close()


def batch_api(app: FastAPI, settings: Settings, client: aioredis.Redis) -> BatchFeeder:
    """The files and batches services on app.state, and the batch feeder (not yet started)."""
    storage = storage_from_settings(settings)
    files = Files(FileRecords(client), storage, settings.file_max_bytes, settings.file_quota_bytes)
    app.state.files = files
    store = BatchStore(client, settings.job_ttl_s)
    app.state.batches = Batches(settings, store, files)
    return BatchFeeder(settings, client, store, files, app.state.queue, app.state.schema_checker)


@asynccontextmanager
async def running_feeder(feeder: BatchFeeder) -> AsyncIterator[None]:
    """The batch feeder as a task of this process's event loop."""
    feeding = asyncio.create_task(feeder.run_forever(), name="genq-batch-feeder")
    try:
        yield
    finally:
        feeder.stop()
        await feeding


@dataclass(slots=True)
class Services:
    """What the lifespan opens on the app's Redis and closes when the process stops."""

    client: aioredis.Redis
    commands: Commands
    events: JobEvents
    hub: StreamHub
    cache: ResponseCache
    feeder: BatchFeeder
    schemas: SchemaChecker

    async def close(self) -> None:
        self.schemas.close()
        await self.events.stop()
        await self.hub.stop()
        await self.cache.close()
        await self.commands.aclose()
        await self.client.aclose()


async def open_services(app: FastAPI, settings: Settings) -> Services:
    """Every service the routes reach through app.state, on one Redis client; the job events'
    and the stream hub's listeners started, each on a connection of its own."""
    client = redis_client(settings)
    events = JobEvents(listener_client(settings))
    commands = await open_commands(client, settings.api_autopipeline, settings.api_redis_wire)
    app.state.settings = settings
    app.state.redis = client
    app.state.rate_limiter = RateLimiter(client, commands, settings)
    schemas = app.state.schema_checker = SchemaChecker(CompileBudget.of(settings))
    cache, hub, store = job_api(app, settings, client, commands, events)
    feeder = batch_api(app, settings, client)
    await preload_scripts(store)
    events.start()
    hub.start()
    return Services(client, commands, events, hub, cache, feeder, schemas)


async def preload_scripts(store: JobStore) -> None:
    """Load the job scripts before the first request needs them. Redis being down at start-up
    does not stop it: the scripts are then loaded on first use (NOSCRIPT), as after a restart."""
    try:
        await store.load_scripts()
    except redis.exceptions.RedisError as exc:
        logging.getLogger("genq.api").warning("scripts_not_preloaded", extra=fields(error=str(exc)))


def job_api(
    app: FastAPI, settings: Settings, client: aioredis.Redis, commands: Commands, events: JobEvents
) -> tuple[ResponseCache, StreamHub, JobStore]:
    """The job queue on app.state, with what it reads that the app also serves: queue stats,
    the response cache, the stream hub; and its store."""
    store = JobStore(client, commands, settings.job_ttl_s, settings.idempotency_ttl_s, bounds_of(settings))
    # The webhook queue too: its length is the delivery backlog operators watch.
    queues = [keys.queue_for_model(m) for m in settings.served_models] + [keys.WEBHOOK_QUEUE]
    queue_stats = app.state.queue_stats = QueueStatsReader(client, queues)
    cache = app.state.cache = ResponseCache(settings, client)
    hub = app.state.stream_hub = StreamHub(listener_client(settings))
    app.state.queue = JobQueue(
        settings, store, events, OutputStreams(commands), queue_stats, cache, hub, app.state.rate_limiter
    )
    return cache, hub, store


def lifespan_of(settings: Settings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: services open, the batch feeder and the reaper running, while it serves."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await open_services(app, settings)
        # Everything built so far (~80k objects: modules, FastAPI's routes, pydantic schemas) lives
        # as long as the process. Freezing it keeps the cyclic GC from traversing it: otherwise a
        # full collection is a long pause every request in flight pays.
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
        try:
            async with running_feeder(services.feeder):
                with running_reaper(settings):
                    yield
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            await services.close()

    return lifespan


def configure_process(settings: Settings) -> None:
    """What this process takes from the settings before any app exists: logging, and the
    header timeout uvicorn's protocol objects read (they are built from uvicorn's own config;
    api/edge/uvicorn_adapter.py)."""
    configure_logging(settings.log_level)
    HeaderTimeoutProtocol.header_timeout_s = settings.api_header_timeout_s


def install_routes(app: FastAPI) -> None:
    """The error handlers, every resource's routes, and the playground's static files."""
    install_error_handlers(app)
    routers = (jobs.router, ops.router, stream.router, openai.router, files.router, batches.router,
               playground.router, webhooks.router, webhooks.secret_router)  # fmt: skip
    for router in routers:
        app.include_router(router)
    check_routes(app.routes)  # every route that serves a caller goes through serve()
    app.mount("/static", playground.static_files(), name="static")


def add_middleware(app: FastAPI, settings: Settings) -> None:
    """The app's middleware, innermost first (each `add_middleware` wraps what was added before):
    the hot paths (api/routes/hotpath.py; their routes checked now, not on every request later),
    the body size limit (uploads to /v1/files get theirs), the request metrics, and, without API
    keys, the anonymous guard, which goes first: nothing it refuses reaches the rest."""
    if settings.api_hot_paths:
        app.add_middleware(HotPaths, routes=HotRoutes.of(app.routes))
    uploads = {"/v1/files": settings.file_max_bytes + MULTIPART_OVERHEAD}
    linger = Linger(settings.api_linger_max_bytes, settings.api_linger_s)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, linger=linger, per_path=uploads)
    app.add_middleware(HttpMetrics)
    if not settings.api_key_digests:
        app.add_middleware(AnonymousGuard, allowed_hosts=settings.allowed_hosts)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_process(settings)
    app = FastAPI(
        title="genq",
        version="0.1.0",
        summary="LLM inference jobs: submit, poll, stream, cancel.",
        lifespan=lifespan_of(settings),
        # Metrics are Prometheus (api/edge/observability.py). FastAPI's native OpenTelemetry hook would
        # otherwise check for a configured provider on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_routes(app)
    add_middleware(app, settings)
    logging.getLogger("genq.api").debug("app created")
    return app

"""The API's files and batches services on the suite's Redis and a local file folder, without the
feeder (tests that need a batch to move move it themselves)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from api.batches.files import Files
from api.batches.filestore import LocalStorage
from cli.redis_server import EmbeddedRedis
from shared.files import FileRecords

#: GENQ_FILE_MAX_BYTES for these tests.
MAX_BYTES = 1000


@pytest.fixture
async def aio_redis(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "files"


@pytest.fixture
def files(aio_redis: aioredis.Redis, folder: Path) -> Files:
    return Files(FileRecords(aio_redis), LocalStorage(folder), MAX_BYTES)

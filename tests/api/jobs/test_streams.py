"""api/jobs/streams.py: reading a job's output stream as the worker writes it (real Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
import redis
import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from api.jobs import streams
from api.jobs.streams import START_ID, OutputEntry, OutputStreams, is_entry_id
from api.redis_io.commands import open_commands
from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.schemas import TokenLogprob

pytestmark = pytest.mark.anyio

JOB = "6f1c0a2e-8b1d-4c3e-9f00-0123456789ab"


@pytest.fixture
async def output_streams(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> AsyncIterator[OutputStreams]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    commands = await open_commands(client)  # batched, as the app opens them
    yield OutputStreams(commands)
    await commands.aclose()
    await client.aclose()


async def test_entries_read_back_with_their_fields_after_an_exclusive_cursor(
    output_streams: OutputStreams, redis_client: redis.Redis
) -> None:
    stream = keys.job_stream(JOB)
    logprobs: list[TokenLogprob] = [{"id": 7, "token": "b", "text": "b", "logprob": -0.5, "top_logprobs": []}]
    first = str(redis_client.xadd(stream, {"delta": "a", "tokens": 1}))
    fields: dict[FieldT, EncodableT] = {
        "delta": "b",
        "tokens": 2,
        "index": 1,
        "logprobs": orjson.dumps(logprobs),
    }
    second = str(redis_client.xadd(stream, fields))
    assert await output_streams.read_all(JOB) == [
        OutputEntry(first, "a", 1),
        OutputEntry(second, "b", 2, 1, logprobs),
    ]
    assert await output_streams.read_all(JOB, first) == [OutputEntry(second, "b", 2, 1, logprobs)]
    assert await output_streams.read_all(JOB, second) == []
    assert await output_streams.read_all("0f1c0a2e-8b1d-4c3e-9f00-0123456789ab") == []  # no stream yet


async def test_a_stream_longer_than_one_read_is_read_whole(
    output_streams: OutputStreams, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "READ_COUNT", 4)
    ids = [redis_client.xadd(keys.job_stream(JOB), {"delta": str(i), "tokens": i}) for i in range(10)]
    entries = await output_streams.read_all(JOB, START_ID)
    assert [e.id for e in entries] == ids and "".join(e.delta for e in entries) == "0123456789"
    assert len(await output_streams.read(JOB, START_ID)) == 4  # one read is one page


def test_entry_ids_are_recognised() -> None:
    assert is_entry_id("1700000000000-0") and is_entry_id(START_ID)
    for text in ("final", "1-", "-1", "1-2-3", "a-1", "1" * 21 + "-0", ""):
        assert not is_entry_id(text), text

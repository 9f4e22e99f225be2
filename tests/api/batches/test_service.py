"""api/batches/service.py: creating a batch checks its endpoint, window, input file and webhook
target; a file a live batch reads cannot be taken from under it; a batch's progress is sent on
each change until it ends. Real Redis, a local file folder, no feeder: a test moves its batch as
the feeder would. (The HTTP contract is tests/api/routes/test_batches.py's.)"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from api.batches import service
from api.batches.files import Files
from api.batches.service import BatchCreate, Batches
from shared import keys
from shared.batches import BatchOutcome, BatchStatus, BatchStore
from shared.config import Settings
from shared.errors import Conflict, InvalidRequest, NotFound, QuotaExceeded

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
HOOK = "http://127.0.0.1:8080/hook"  # loopback: a target only GENQ_WEBHOOK_ALLOW_PRIVATE allows


def batches_of(settings: Settings, aio_redis: aioredis.Redis, files: Files) -> Batches:
    return Batches(settings, BatchStore(aio_redis, settings.job_ttl_s), files)


@pytest.fixture
def batches(settings: Settings, aio_redis: aioredis.Redis, files: Files) -> Batches:
    return batches_of(settings, aio_redis, files)


async def input_file(files: Files, owner: str = "alice") -> str:
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    return str((await files.upload(owner, io.BytesIO(line), "in.jsonl", "batch"))["id"])


def create(file_id: str, **more: Any) -> BatchCreate:
    return BatchCreate.model_validate(
        {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"} | more
    )


async def test_a_batch_is_created_validating_with_its_window(
    batches: Batches, files: Files, settings: Settings
) -> None:
    file_id = await input_file(files)
    batch = await batches.create(create(file_id, metadata={"team": "a"}), "alice")
    assert batch["status"] == "validating" and batch["input_file_id"] == file_id
    assert batch["metadata"] == {"team": "a"}
    assert batch["expires_at"] - batch["created_at"] in range(
        int(settings.batch_completion_window_s) - 1, int(settings.batch_completion_window_s) + 2
    )
    assert await batches.get(batch["id"], "alice") == batch
    with pytest.raises(NotFound):
        await batches.get(batch["id"], "bob")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
        ({"metadata": {"webhook_url": HOOK}}, "metadata.webhook_url"),
    ],
)
async def test_a_bad_create_names_its_field_and_creates_nothing(
    batches: Batches, files: Files, redis_client: redis.Redis, fields: dict[str, Any], param: str
) -> None:
    file_id = await input_file(files)
    with pytest.raises(InvalidRequest) as refused:
        await batches.create(create(file_id, **fields), "alice")
    assert refused.value.param == param
    assert redis_client.keys(keys.batch("*")) == []
    assert (await batches.page("alice", None, 10))["data"] == []


async def test_another_keys_file_is_no_input(batches: Batches, files: Files) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await batches.create(create(await input_file(files, owner="bob")), "alice")
    assert refused.value.param == "input_file_id"


async def test_the_webhook_is_the_metadatas_else_the_keys_default(
    make_settings: Callable[..., Settings], aio_redis: aioredis.Redis, files: Files, redis_client: redis.Redis
) -> None:
    settings = make_settings(webhook_allow_private=True, batch_webhook_urls={"alice": HOOK})
    batches = batches_of(settings, aio_redis, files)
    file_id = await input_file(files)
    default = await batches.create(create(file_id), "alice")
    own = await batches.create(create(file_id, metadata={"webhook_url": HOOK + "/own"}), "alice")
    other_key = await batches.create(create(await input_file(files, "bob")), "bob")
    assert [redis_client.hget(keys.batch(b["id"]), "webhook_url") for b in (default, own, other_key)] == [
        HOOK,
        HOOK + "/own",
        "",
    ]


async def test_a_file_a_live_batch_reads_cannot_be_taken(batches: Batches, files: Files) -> None:
    file_id, other = await input_file(files), await input_file(files)
    batch = await batches.create(create(file_id), "alice")
    with pytest.raises(Conflict) as refused:
        await batches.check_unused(file_id)
    assert batch["id"] in refused.value.message and refused.value.param == "file_id"
    await batches.check_unused(other)


async def test_progress_is_sent_on_each_change_until_the_batch_ends(
    batches: Batches, files: Files, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "PROGRESS_PING_S", 0.15)
    batch = await batches.create(create(await input_file(files)), "alice")
    seen: list[dict[str, Any] | None] = []

    async def watch() -> None:
        async for update in batches.progress(batch["id"], "alice", poll_s=0.05):
            seen.append(update)

    watching = asyncio.create_task(watch())
    await asyncio.sleep(0.3)  # unchanged meanwhile: pings only
    assert seen[0] == batch and None in seen[1:] and all(u is None for u in seen[1:])
    await batches.cancel(batch["id"], "alice")  # cancelling: not yet ended
    await asyncio.sleep(0.15)
    assert [u["status"] for u in seen if u is not None] == ["validating", "cancelling"]
    redis_client.hset(keys.batch(batch["id"]), "status", "cancelled")  # as the feeder ends it
    await asyncio.wait_for(watching, 2)
    assert [u["status"] for u in seen if u is not None] == ["validating", "cancelling", "cancelled"]


async def test_progress_stops_when_the_batch_is_gone(
    batches: Batches, files: Files, redis_client: redis.Redis
) -> None:
    batch = await batches.create(create(await input_file(files)), "alice")
    redis_client.delete(keys.batch(batch["id"]))
    assert [u async for u in batches.progress(batch["id"], "alice", poll_s=0.05)] == []
    assert [u async for u in batches.progress("batch_nope", "alice", poll_s=0.05)] == []


async def test_a_key_has_a_bound_on_its_active_batches_and_an_end_frees_a_slot(
    make_settings: Callable[..., Settings], aio_redis: aioredis.Redis, files: Files, redis_client: redis.Redis
) -> None:
    batches = batches_of(make_settings(batch_active_max=2), aio_redis, files)
    file_id = await input_file(files)
    first = await batches.create(create(file_id), "alice")
    await batches.create(create(file_id), "alice")
    with pytest.raises(QuotaExceeded) as refused:
        await batches.create(create(file_id), "alice")
    assert refused.value.param == "active_batches" and "GENQ_BATCH_ACTIVE_MAX" in refused.value.message
    assert redis_client.zcard(keys.owner_batches("alice")) == 2  # the refused create wrote nothing
    await batches.create(create(await input_file(files, "bob")), "bob")  # another key is not bound by alice's
    # Ending a batch (here cancelled, as the feeder ends it) frees its slot.
    cancelled = BatchOutcome(BatchStatus.CANCELLED)
    assert await batches.store.finish(await batches.store.record(first["id"]), cancelled)
    await batches.create(create(file_id), "alice")

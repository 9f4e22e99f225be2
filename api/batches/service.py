"""The API's door to batches: create (checking the input file and the fields OpenAI's clients
send), read, list, cancel. The feeder (api/batches/feeder.py) does the rest."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.batches.files import Files
from shared.batches import BATCH_ENDPOINTS, BatchStatus, BatchStore, NewBatch, new_batch_id, public_batch
from shared.config import Settings
from shared.errors import Conflict, InvalidRequest, NotFound, QuotaExceeded
from shared.files import FilePurpose
from shared.schemas import MetadataKey, MetadataValue
from shared.ssrf import check_url

#: The metadata entry naming a batch's webhook URL.
WEBHOOK_METADATA_KEY = "webhook_url"

#: How often a progress stream re-reads its batch: the feeder moves a batch once a period
#: (GENQ_BATCH_FEEDER_INTERVAL_S, 0.5 s by default), so reading faster would show nothing new.
PROGRESS_POLL_S = 0.5
#: An idle progress stream yields a ping this often, so proxies keep the connection open.
PROGRESS_PING_S = 15.0


class OutputExpiresAfter(BaseModel):
    """OpenAI's output_expires_after: the output and error files expire this long after made."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2_592_000)


class BatchCreate(BaseModel):
    """The body of POST /v1/batches. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    endpoint: str
    completion_window: str
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None
    output_expires_after: OutputExpiresAfter | None = None


class Batches:
    def __init__(self, settings: Settings, store: BatchStore, files: Files) -> None:
        self._settings = settings
        self.store = store
        self._files = files

    async def create(self, body: BatchCreate, owner: str) -> dict[str, Any]:
        if body.endpoint not in BATCH_ENDPOINTS:
            raise InvalidRequest(
                f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)} (got {body.endpoint!r})",
                param="endpoint",
            )
        if body.completion_window != "24h":
            raise InvalidRequest("completion_window must be '24h'", param="completion_window")
        file = await self._files.records.get(body.input_file_id, owner)
        if file is None or file["purpose"] != FilePurpose.BATCH:
            raise InvalidRequest(f"no batch input file {body.input_file_id!r}", param="input_file_id")
        now = time.time()
        expires = body.output_expires_after.seconds if body.output_expires_after else 0
        webhook = await self._webhook_url(body.metadata or {}, owner)
        window = self._settings.batch_completion_window_s
        new = NewBatch(new_batch_id(), owner, body.endpoint, body.input_file_id, now, now + window,
                       body.metadata, expires, webhook)  # fmt: skip
        made = await self.store.create(new, self._settings.batch_active_max)
        if made is None:
            limit = self._settings.batch_active_max
            raise QuotaExceeded(
                f"this API key has {limit} batches not yet ended (GENQ_BATCH_ACTIVE_MAX); wait for one "
                "to end, or cancel one",
                param="active_batches",
            )
        return public_batch(made)

    async def _webhook_url(self, metadata: dict[str, str], owner: str) -> str:
        """Where the batch's end is announced: metadata's webhook_url, else the key's default."""
        url = metadata.get(WEBHOOK_METADATA_KEY) or self._settings.batch_webhook_urls.get(owner, "")
        if url:
            try:
                await check_url(url, self._settings.webhook_policy)
            except InvalidRequest as exc:
                raise InvalidRequest(exc.message, param=f"metadata.{WEBHOOK_METADATA_KEY}") from None
        return url

    async def check_unused(self, file_id: str) -> None:
        """Conflict while a batch not yet ended reads the file (its lines would be lost)."""
        for record in await self.store.active():
            if record["input_file_id"] == file_id:
                raise Conflict(f"batch {record['id']} is reading this file; cancel it first", param="file_id")

    async def get(self, batch_id: str, owner: str) -> dict[str, Any]:
        record = await self.store.get(batch_id, owner)
        if record is None:
            raise NotFound(f"no batch {batch_id!r}", param="batch_id")
        return public_batch(record)

    async def progress(
        self, batch_id: str, owner: str, poll_s: float = PROGRESS_POLL_S
    ) -> AsyncIterator[dict[str, Any] | None]:
        """The batch now, then again whenever it changes (status, counts, files), until it has
        ended; None when a ping is due. Stops early should the batch's record lapse."""
        shown: dict[str, Any] | None = None
        quiet_s = 0.0
        while True:
            try:
                batch = await self.get(batch_id, owner)
            except NotFound:
                return
            if batch != shown:
                shown, quiet_s = batch, 0.0
                yield batch
            elif quiet_s >= PROGRESS_PING_S:
                quiet_s = 0.0
                yield None
            if BatchStatus(batch["status"]).is_terminal():
                return
            await asyncio.sleep(poll_s)
            quiet_s += poll_s

    async def cancel(self, batch_id: str, owner: str) -> dict[str, Any]:
        record = await self.store.cancel(batch_id, owner)
        if record is None:
            raise NotFound(f"no batch {batch_id!r}", param="batch_id")
        return public_batch(record)

    async def page(self, owner: str, after: str | None, limit: int) -> dict[str, Any]:
        found, more = await self.store.page(owner, after, limit)
        data = [public_batch(record) for record in found]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}

"""Reading a job's output stream (keys.JOB_STREAM): the API side of workers/publish.py.

Entries are `{delta, tokens}`, with `index` (a completion other than the first, OpenAI's n) and
`logprobs` (JSON list of the new tokens' entries, when the job asked for them); their Redis ids
are increasing, so a reader resumes after the last id it saw (XRANGE with an exclusive start).
Waiting for new ones is the stream hub's (api/jobs/stream_hub.py): one pub/sub subscription per
process, never a blocking read per reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from api.redis_io.commands import Commands
from shared import keys
from shared.schemas import TokenLogprob

#: The id before every entry: reading after it reads the stream from its beginning.
START_ID = "0-0"
#: Entries read per round trip; a job's stream holds at most about JOB_STREAM_MAXLEN.
READ_COUNT = 512

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


@dataclass(frozen=True, slots=True)
class OutputEntry:
    """One published piece of a job's output."""

    id: str
    delta: str
    #: Completion tokens generated so far (when the delta was published).
    tokens: int
    #: Which of the job's completions (n) this continues.
    index: int = 0
    #: Log-probability entries of the tokens streamed since the completion's previous entry (in the
    #: job output's format); None when the job asked for none. Their texts may trail `delta`.
    logprobs: list[TokenLogprob] | None = None


def is_entry_id(text: str) -> bool:
    """Whether text is a Redis stream entry id (`<ms>-<seq>`)."""
    return _ENTRY_ID.match(text) is not None


class OutputStreams:
    """The API's reader of job output streams (asyncio). Reads go through the API's batched
    commands (api/redis_io/batching.py): thousands of followers woken together (a hub reconnect
    wakes them all) share its connection (or a few, as redis-py pipelines) instead of each taking
    one from the pool, which ran dry at 512."""

    def __init__(self, commands: Commands) -> None:
        self._commands = commands

    async def read(self, job_id: str, after_id: str) -> list[OutputEntry]:
        """Up to READ_COUNT entries after `after_id`, oldest first."""
        return page_of(await self._commands.execute(*page_command(job_id, after_id)))

    async def read_all(self, job_id: str, after_id: str = START_ID) -> list[OutputEntry]:
        """Every entry after `after_id` (paged), without waiting."""
        found: list[OutputEntry] = []
        while page := await self.read(job_id, after_id):
            found.extend(page)
            after_id = page[-1].id
            if len(page) < READ_COUNT:
                break
        return found


def page_command(job_id: str, after_id: str) -> tuple[Any, ...]:
    """The command that reads up to READ_COUNT entries after `after_id` (page_of reads its reply)."""
    return ("XRANGE", keys.job_stream(job_id), f"({after_id}", "+", "COUNT", READ_COUNT)


def page_of(rows: Any) -> list[OutputEntry]:
    """The entries of page_command's reply, oldest first."""
    return [_entry(str(entry_id), fields) for entry_id, fields in rows or []]


def _entry(entry_id: str, fields: dict[str, Any]) -> OutputEntry:
    logprobs = fields.get("logprobs")
    return OutputEntry(
        entry_id,
        str(fields.get("delta", "")),
        int(fields.get("tokens", 0) or 0),
        int(fields.get("index", 0) or 0),
        None if logprobs is None else list(orjson.loads(logprobs)),
    )

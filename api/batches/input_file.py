"""A batch's input file, as the feeder reads it: validating it in one streamed pass when the
batch is new (whole-file problems fail the batch; refused lines are kept for their error
results), and taking the next lines from the batch's durable cursor (a byte offset and a line
number) to feed or to report as not run. Reads run on a thread: storage calls block."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import anyio.to_thread

from api.batches.files import Files
from api.batches.filestore import FileStorage, lines_from
from api.batches.lines import input_problem, validate
from shared.batches import BatchStatus, BatchStore, Ending
from shared.errors import NotFound
from shared.logging import fields

log = logging.getLogger("genq.batches")


def input_gone(record: dict[str, str], how: str) -> Ending:
    """The batch fails: its input file is gone (`how` says when it went)."""
    message = f"the input file {record['input_file_id']} {how}"
    return Ending(BatchStatus.FAILED, errors=[input_problem("file_not_found", message, None)])


async def validate_input(
    record: dict[str, str], files: Files, store: BatchStore, max_lines: int
) -> Ending | None:
    """Check a validating batch's input file and record its request count and refused lines;
    how the batch ends instead when its window has passed or the file is gone or wrong as a whole."""
    batch_id, endpoint = record["id"], record["endpoint"]
    if time.time() > float(record["expires_at"]):
        return Ending(BatchStatus.EXPIRED)
    try:
        await files.get(record["input_file_id"], record["owner"])
        chunks = await anyio.to_thread.run_sync(files.storage.read, record["input_file_id"])
    except (NotFound, FileNotFoundError):
        return input_gone(record, "is gone")
    checked = await anyio.to_thread.run_sync(
        lambda: validate(lines_from(chunks), endpoint, batch_id, max_lines)
    )
    if checked.problem is not None:
        return Ending(BatchStatus.FAILED, errors=[checked.problem])
    await store.validated(batch_id, checked.total, checked.invalid)
    log.info(
        "batch_validated", extra=fields(batch_id=batch_id, total=checked.total, invalid=len(checked.invalid))
    )
    return None


@dataclass(slots=True)
class Taken:
    """Lines read from the input file at the batch's cursor."""

    #: (line number, its bytes, its offset in the file)
    lines: list[tuple[int, bytes, int]] = field(default_factory=list)
    end_offset: int = 0
    end_line: int = 0
    at_end: bool = False


def take_lines(storage: FileStorage, name: str, offset: int, line: int, count: int) -> Taken:
    """Up to `count` request lines from byte `offset` (after line number `line`); blank lines are
    stepped over. Blocking: run it on a thread."""
    taken = Taken(end_offset=offset, end_line=line)
    chunks = storage.read(name, offset)
    lines = lines_from(chunks)
    try:
        for raw in lines:
            if len(taken.lines) == count:
                return taken
            taken.end_line += 1
            if raw.strip():
                taken.lines.append((taken.end_line, raw, taken.end_offset))
            taken.end_offset += len(raw)
        taken.at_end = True
        return taken
    finally:
        _close(chunks)


async def take_at_cursor(storage: FileStorage, record: dict[str, str], count: int) -> Taken:
    """take_lines at the batch's cursor, on a thread."""
    offset, line = int(record["cursor_offset"]), int(record["cursor_line"])
    return await anyio.to_thread.run_sync(take_lines, storage, record["input_file_id"], offset, line, count)


def _close(chunks: Iterator[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()

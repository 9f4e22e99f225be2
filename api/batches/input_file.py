"""A batch's input file, as the feeder reads it: validating it in one streamed pass when the
batch is new (whole-file problems fail the batch; the numbers of the lines that repeat a
custom_id are kept in the file storage beside the batch's result parts: every other refusal is
found again from the line itself), and taking the next lines from the batch's durable cursor (a
byte offset and a line number) to feed or to report as not run. Lines are split with a cap on
their length (api/batches/splitter.py). Reads run on a thread: storage calls block."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import anyio.to_thread
import orjson

from api.batches.files import Files
from api.batches.filestore import FileStorage
from api.batches.line_schemas import BatchSchemas, write_refused
from api.batches.lines import Validation, input_problem, validate
from api.batches.splitter import Line, line_size, split_lines
from api.jobs.schema_compile import SchemaChecker
from shared.batches import BatchOutcome, BatchStatus, BatchStore
from shared.errors import NotFound
from shared.logging import fields

log = logging.getLogger("genq.batches")


def input_gone(record: dict[str, str], how: str) -> BatchOutcome:
    """The batch fails: its input file is gone (`how` says when it went)."""
    message = f"the input file {record['input_file_id']} {how}"
    return BatchOutcome(BatchStatus.FAILED, errors=[input_problem("file_not_found", message, None)])


def lost_from_storage(record: dict[str, str], lost: FileNotFoundError) -> BatchOutcome:
    """The batch fails: content it needs went from storage mid-batch (`lost` names it): its input
    file, or its own files (results written so far, what validation kept)."""
    if record["input_file_id"] in str(lost):
        return input_gone(record, "was removed from storage during the batch")
    message = "the batch's own files were lost from storage (results written so far, or what validation kept)"
    problem = {"code": "storage_lost", "message": message, "param": None, "line": None}
    return BatchOutcome(BatchStatus.FAILED, errors=[problem])


def duplicates_name(batch_id: str) -> str:
    """The storage name of a batch's repeated-custom_id line numbers (a JSON array)."""
    return f"{batch_id}/duplicates"


def read_duplicates(storage: FileStorage, batch_id: str) -> frozenset[int]:
    """The numbers of the batch's lines refused as duplicate_custom_id. Blocking."""
    return frozenset(orjson.loads(b"".join(storage.read(duplicates_name(batch_id)))))


async def validate_input(
    record: dict[str, str],
    files: Files,
    store: BatchStore,
    max_lines: int,
    line_max_bytes: int,
    *,
    schemas: SchemaChecker,
    schemas_max: int,
) -> BatchOutcome | None:
    """Check a validating batch's input file and record its request count and refused lines;
    how the batch ends instead when its window has passed or the file is gone or wrong as a whole.
    Each distinct response-format schema is compiled here, once (off the event loop), up to
    `schemas_max` of them. The files kept beside the batch for the feeder count against its
    owner's file quota until the batch ends (batch_validated.lua, batch_finish.lua)."""
    batch_id = record["id"]
    if time.time() > float(record["expires_at"]):
        return BatchOutcome(BatchStatus.EXPIRED)
    try:
        await files.get(record["input_file_id"], record["owner"])
        checked, kept_bytes = await anyio.to_thread.run_sync(
            _validate_file,
            files.storage,
            record,
            max_lines,
            line_max_bytes,
            BatchSchemas(schemas, schemas_max),
        )
    except (NotFound, FileNotFoundError):
        return input_gone(record, "is gone")
    if checked.problem is not None:
        return BatchOutcome(BatchStatus.FAILED, errors=[checked.problem])
    if checked.duplicates:
        name, content = duplicates_name(batch_id), orjson.dumps(checked.duplicates)
        kept_bytes += await anyio.to_thread.run_sync(files.storage.put, name, [content])
    await store.validated(record, checked.total, len(checked.duplicates), kept_bytes)
    log.info("batch_validated", extra=fields(batch_id=batch_id, total=checked.total, refused=checked.refused))
    return None


def _validate_file(
    storage: FileStorage,
    record: dict[str, str],
    max_lines: int,
    line_max_bytes: int,
    schemas: BatchSchemas,
) -> tuple[Validation, int]:
    """The file's validation, and the bytes written beside the batch for the feeder."""
    chunks = storage.read(record["input_file_id"])
    try:
        lines = split_lines(chunks, line_max_bytes)
        checked = validate(lines, record["endpoint"], record["id"], max_lines, schemas.check)
    finally:
        _close(chunks)
    if checked.problem is not None:
        return checked, 0
    # The feeder refuses those schemas' lines by hash (line_schemas.py).
    return checked, write_refused(storage, record["id"], schemas.kept())


@dataclass(slots=True)
class Taken:
    """Lines read from the input file at the batch's cursor."""

    #: (line number, its bytes or TooLong, its offset in the file)
    lines: list[tuple[int, Line, int]] = field(default_factory=list)
    end_offset: int = 0
    end_line: int = 0
    at_end: bool = False


def take_lines(
    storage: FileStorage, name: str, offset: int, line: int, count: int, line_max_bytes: int
) -> Taken:
    """Up to `count` request lines from byte `offset` (after line number `line`); blank lines are
    stepped over, lines over `line_max_bytes` come as TooLong. Blocking: run it on a thread."""
    taken = Taken(end_offset=offset, end_line=line)
    chunks = storage.read(name, offset)
    try:
        for raw in split_lines(chunks, line_max_bytes):
            if len(taken.lines) == count:
                return taken
            taken.end_line += 1
            if not isinstance(raw, bytes) or raw.strip():
                taken.lines.append((taken.end_line, raw, taken.end_offset))
            taken.end_offset += line_size(raw)
        taken.at_end = True
        return taken
    finally:
        _close(chunks)


async def take_at_cursor(
    storage: FileStorage, record: dict[str, str], count: int, line_max_bytes: int
) -> Taken:
    """take_lines at the batch's cursor, on a thread."""
    offset, line = int(record["cursor_offset"]), int(record["cursor_line"])
    name = record["input_file_id"]
    return await anyio.to_thread.run_sync(take_lines, storage, name, offset, line, count, line_max_bytes)


def _close(chunks: Iterator[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()

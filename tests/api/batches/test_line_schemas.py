"""api/batches/line_schemas.py: a batch's schemas compiled once each at validation (real compile
processes), the refused ones' verdicts kept in the file storage and found again by hash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from api.batches.filestore import LocalStorage
from api.batches.line_schemas import (
    TOO_MANY_SCHEMAS,
    BatchSchemas,
    KeptSchemas,
    read_refused,
    refused_again,
    write_refused,
)
from api.batches.lines import LineError, LineRequest, parse_line, validate
from api.jobs.schema_compile import CompileBudget, SchemaChecker
from tests.api.routes.test_batches import CHAT, chat_line

GOOD = {"type": "json_schema", "json_schema": {"name": "g", "schema": {"type": "string"}}}
BAD = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "strin"}}}


@pytest.fixture
def checker() -> Iterator[SchemaChecker]:
    checker = SchemaChecker(CompileBudget(timeout_s=30, memory_bytes=512 << 20, cache_entries=0))
    yield checker
    checker.close()


def request(custom_id: str, number: int, **body: object) -> LineRequest:
    parsed = parse_line(chat_line(custom_id, "hi", **body), number, CHAT, "batch_x")
    assert isinstance(parsed, LineRequest)
    return parsed


def test_each_distinct_schema_compiles_once_and_refusals_are_kept_by_hash(checker: SchemaChecker) -> None:
    lines = [chat_line(f"g{i}", "hi", response_format=GOOD) for i in range(3)]
    lines += [chat_line(f"b{i}", "hi", response_format=BAD) for i in range(3)] + [chat_line("plain", "hi")]
    schemas = BatchSchemas(checker, most=64)
    checked = validate(lines, CHAT, "batch_x", max_lines=10, schemas=schemas.check)
    assert checked.total == 7 and checked.refused == 3
    assert checker.compiles == 2  # no cache in the checker: the batch's own record held them
    kept = schemas.kept()
    assert len(kept.refused) == 1 and kept.passed is None
    (verdict,) = kept.refused.values()
    assert verdict == "the JSON schema cannot be enforced: Invalid type: strin"


def test_the_feeder_finds_a_refusal_again_without_compiling(checker: SchemaChecker) -> None:
    schemas = BatchSchemas(checker, most=64)
    assert schemas.check(request("b0", 1, response_format=BAD), 1) is not None
    compiled = checker.compiles
    again = refused_again(request("b1", 7, response_format=BAD), 7, schemas.kept())
    assert isinstance(again, LineError) and again.custom_id == "b1" and again.code == "invalid_request"
    assert again.message == "line 7: response_format: the JSON schema cannot be enforced: Invalid type: strin"
    assert refused_again(request("g", 8, response_format=GOOD), 8, schemas.kept()) is None
    assert refused_again(request("p", 9), 9, schemas.kept()) is None
    assert checker.compiles == compiled


def test_refused_schemas_round_trip_through_the_storage(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    assert read_refused(storage, "batch_x") == KeptSchemas()
    assert write_refused(storage, "batch_x", KeptSchemas()) == 0  # nothing refused: nothing written
    assert read_refused(storage, "batch_x") == KeptSchemas()
    kept = KeptSchemas({"ab12": "why"}, frozenset({"cd34"}), 2)
    written = write_refused(storage, "batch_x", kept)
    assert read_refused(storage, "batch_x") == kept
    assert written == len(b"".join(storage.read("batch_x/schemas")))
    assert orjson.loads(b"".join(storage.read("batch_x/schemas")))["refused"] == {"ab12": "why"}


def schema_format(index: int) -> dict[str, object]:
    schema = {"type": "object", "properties": {f"p{index}": {"type": "string"}}}
    return {"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": schema}}


def test_a_batch_carries_a_bounded_number_of_schemas_and_compiles_no_more(checker: SchemaChecker) -> None:
    """Past GENQ_BATCH_SCHEMAS_MAX distinct schemas, a line is refused as too_many_schemas without
    compiling; the schemas already met still pass, and the feeder finds both again by hash."""
    lines = [chat_line(f"l{i}", "hi", response_format=schema_format(i % 5)) for i in range(10)]
    schemas = BatchSchemas(checker, most=2)
    checked = validate(lines, CHAT, "batch_x", max_lines=20, schemas=schemas.check)
    assert checker.compiles == 2  # the first two schemas; the other three are never compiled
    assert checked.total == 10 and checked.refused == 6
    refusal = schemas.check(request("l2", 3, response_format=schema_format(2)), 3)
    assert isinstance(refusal, LineError) and refusal.code == TOO_MANY_SCHEMAS
    assert "GENQ_BATCH_SCHEMAS_MAX" in refusal.message and "2 distinct" in refusal.message
    kept = schemas.kept()
    again = refused_again(request("l7", 8, response_format=schema_format(2)), 8, kept)
    assert isinstance(again, LineError) and again.code == TOO_MANY_SCHEMAS
    assert refused_again(request("l6", 7, response_format=schema_format(1)), 7, kept) is None
    assert refused_again(request("p", 9), 9, kept) is None
    assert checker.compiles == 2

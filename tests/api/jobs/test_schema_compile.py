"""api/jobs/schema_compile.py: verdicts on response formats' schemas from real compile processes,
within a time and a memory budget, kept by the schema's canonical hash."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.jobs.schema_compile import CompileBudget, SchemaChecker, schema_digest
from shared.errors import ConcurrencyLimited, InvalidRequest, RateLimited
from shared.structured import ResponseFormat

pytestmark = pytest.mark.anyio

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}}


def costly_schema(tag: str) -> dict[str, Any]:
    """allOf x anyOf of small objects: about a second of CPU and a hundred MB for llguidance to
    compile. `tag` names its properties, so each test's schema is a schema of its own."""

    def option(i: int, j: int) -> dict[str, Any]:
        name = f"{tag}_{i}_{j}"
        return {"type": "object", "properties": {name: {"type": ["string", "integer"]}}, "required": [name]}

    return {"allOf": [{"anyOf": [option(i, j) for j in range(4)]} for i in range(6)]}


def fmt(schema: dict[str, Any]) -> ResponseFormat:
    return ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    )


@pytest.fixture
def checker() -> Iterator[SchemaChecker]:
    checker = SchemaChecker(CompileBudget(timeout_s=30, memory_bytes=512 << 20, cache_entries=2))
    yield checker
    checker.close()


def test_the_digest_is_of_the_canonical_json() -> None:
    reordered = {"properties": {"zip": {"type": "integer"}, "city": {"type": "string"}}, "type": "object"}
    assert schema_digest(CITY) == schema_digest(reordered)
    assert schema_digest(CITY) != schema_digest({"type": "object"})


def test_verdicts_and_what_needs_no_compile(checker: SchemaChecker) -> None:
    assert checker.verdict(None) is None
    assert checker.verdict(ResponseFormat(type="json_object")) is None
    assert checker.verdict(ResponseFormat(type="text")) is None
    assert checker.compiles == 0
    assert checker.verdict(fmt(CITY)) is None
    error = checker.verdict(fmt({"type": "object", "required": 5}))
    assert error is not None and error.startswith("the JSON schema cannot be enforced:")
    assert checker.compiles == 2 and checker.overruns == 0


def test_the_cache_is_a_bounded_lru(checker: SchemaChecker) -> None:
    first, second, third = fmt(CITY), fmt({"type": "string"}), fmt({"type": "integer"})
    for response_format in (first, second, first, third):  # third evicts second, the least recent
        checker.verdict(response_format)
    assert checker.compiles == 3
    checker.verdict(first)
    assert checker.compiles == 3
    checker.verdict(second)
    assert checker.compiles == 4


async def test_check_raises_naming_response_format(checker: SchemaChecker) -> None:
    await checker.check(fmt(CITY), "k")
    with pytest.raises(InvalidRequest) as refused:
        await checker.check(fmt({"type": "strin"}), "k")
    assert refused.value.param == "response_format"
    assert refused.value.message == "response_format: the JSON schema cannot be enforced: Invalid type: strin"


def test_a_compile_over_its_memory_budget_is_refused_and_its_process_replaced() -> None:
    checker = SchemaChecker(CompileBudget(timeout_s=60, memory_bytes=80 << 20))
    try:
        error = checker.verdict(fmt(costly_schema("memory")))
        assert error == "the JSON schema needs more than 80 MiB to compile"
        assert checker.overruns == 1
        assert checker.verdict(fmt(CITY)) is None  # a new process took the dead one's place
    finally:
        checker.close()


def test_a_compile_over_its_time_budget_is_refused_and_its_process_replaced() -> None:
    checker = SchemaChecker(CompileBudget(timeout_s=0.2, memory_bytes=512 << 20))
    try:
        assert checker.verdict(fmt(costly_schema("time"))) == (
            "the JSON schema is too complex to compile within 0.2 s"
        )
        assert checker.verdict(fmt(costly_schema("time"))) is not None and checker.compiles == 1  # kept
        assert checker.verdict(fmt(CITY)) is None and checker.overruns == 1
    finally:
        checker.close()


def test_compile_processes_run_at_the_niceness_the_budget_says() -> None:
    checker = SchemaChecker(CompileBudget(timeout_s=30, memory_bytes=512 << 20, nice=7))
    try:
        assert checker.verdict(fmt(CITY)) is None
        [pid] = checker.pids()
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, own + 7)
        group = Path(f"/proc/{pid}/autogroup")
        if group.exists():  # a session, so a scheduler group, of its own, as nice
            assert group.read_text() != Path("/proc/self/autogroup").read_text()
            assert group.read_text().split()[-1] == str(min(19, own + 7))
    finally:
        checker.close()


async def test_a_key_with_a_compile_in_flight_is_refused_another_while_other_keys_compile() -> None:
    checker = SchemaChecker(CompileBudget(timeout_s=30, memory_bytes=512 << 20, workers=2, per_key=1))
    try:
        await checker.check(fmt(CITY), "a")
        first = asyncio.create_task(checker.check(fmt(costly_schema("first")), "a"))
        await asyncio.sleep(0)  # the first compile is in flight
        with pytest.raises(ConcurrencyLimited) as refused:
            await checker.check(fmt(costly_schema("second")), "a")
        assert refused.value.param == "response_format" and refused.value.headers["Retry-After"] == "1"
        await checker.check(fmt(CITY), "a")  # a cached verdict needs no compile, so no slot
        await checker.check(fmt(costly_schema("other")), "b")  # another key is not held up
        await first
        await checker.check(fmt(costly_schema("second")), "a")  # once it ended, the key compiles again
        assert checker.compiles == 4
    finally:
        checker.close()


async def test_requests_for_a_schema_being_compiled_wait_for_that_compile_and_take_no_slot() -> None:
    """An SDK client sending one new schema from 16 threads gets 16 answers, not 15 refusals."""
    checker = SchemaChecker(CompileBudget(timeout_s=30, memory_bytes=512 << 20, per_key=1))
    try:
        same = [checker.check(fmt(costly_schema("shared")), owner) for owner in ("a",) * 8 + ("b",) * 8]
        await asyncio.gather(*same)
        assert checker.compiles == 1
    finally:
        checker.close()


async def test_a_key_past_its_compile_cpu_a_minute_gets_429_while_other_keys_compile() -> None:
    budget = CompileBudget(timeout_s=30, memory_bytes=512 << 20, cpu_s_per_key_minute=0.01)
    checker = SchemaChecker(budget)
    try:
        await checker.check(fmt(costly_schema("spent")), "a")  # it runs into debt by this one
        with pytest.raises(RateLimited) as refused:
            await checker.check(fmt(costly_schema("more")), "a")
        assert refused.value.param == "response_format"
        assert "GENQ_SCHEMA_COMPILE_CPU_S_PER_KEY_MINUTE" in refused.value.message
        assert int(refused.value.headers["Retry-After"]) >= 1
        await checker.check(fmt(costly_schema("spent")), "a")  # a cached verdict costs nothing
        await checker.check(fmt(costly_schema("more")), "b")  # another key has its own minute
        assert checker.compiles == 2
    finally:
        checker.close()

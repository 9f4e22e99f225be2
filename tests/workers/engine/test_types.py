"""workers/engine/types.py: the closed message set's behaviour. A request error carries the type
a client sees; the test-only fault file fires once per creation; a failing on_fatal hook is logged
and never hides the engine's death."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.logging import FIELDS
from workers.engine.types import (
    ErrorType,
    FatalEngineError,
    InjectedFault,
    RequestError,
    call_on_fatal,
    check_fault_file,
)


def test_error_types_are_the_job_error_types_clients_see() -> None:
    assert {t.value for t in ErrorType} == {"invalid_request", "unavailable", "canceled", "timeout"}
    error = RequestError(ErrorType.TIMEOUT, "past its deadline")
    assert (error.type, error.message, str(error)) == ("timeout", "past its deadline", "past its deadline")


def test_the_fault_file_fires_once_per_creation(tmp_path: Path) -> None:
    fault = tmp_path / "fault"
    check_fault_file(None)
    check_fault_file(fault)  # absent: nothing happens
    fault.touch()
    with pytest.raises(InjectedFault, match=str(fault)):
        check_fault_file(fault)
    assert not fault.exists()
    check_fault_file(fault)  # deleted: the next step goes on


def test_on_fatal_gets_the_error_and_a_failing_hook_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[FatalEngineError] = []
    error = FatalEngineError("device lost")
    call_on_fatal(seen.append, error)
    call_on_fatal(None, error)
    assert seen == [error]

    def broken(_: FatalEngineError) -> None:
        raise OSError("cannot reach Redis")

    call_on_fatal(broken, error)  # does not raise: the engine is dead either way
    assert [r.getMessage() for r in caplog.records] == ["on_fatal_failed"]
    assert "cannot reach Redis" in str(getattr(caplog.records[0], FIELDS))

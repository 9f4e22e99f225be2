"""The result line of a batch line whose job ended (api/batches/results.py): a lost job record
and a job canceled because its batch was wound up each become the error OpenAI's clients expect.
Collecting and joining parts through real processes is tested in tests/api/routes/test_batches.py."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from api.batches.results import job_line
from api.openai.kind import Kind
from shared.batches import BatchStatus
from shared.schemas import JobStatus, JobView

ENTRY = {"job": "job-1", "custom_id": "req-7"}


def _error(line: bytes) -> Any:
    result = orjson.loads(line)
    assert (result["custom_id"], result["response"]) == ("req-7", None)
    return result["error"]


def test_a_line_whose_job_record_is_gone_is_reported_lost() -> None:
    number, line, ok = job_line("batch_1", 7, ENTRY, Kind.CHAT, None, None)
    assert (number, ok) == (7, False)
    assert _error(line)["code"] == "job_lost"


@pytest.mark.parametrize(
    ("ending", "code"), [(BatchStatus.CANCELLED, "batch_cancelled"), (BatchStatus.EXPIRED, "batch_expired")]
)
def test_a_job_canceled_by_its_batch_ending_says_how_the_batch_ended(ending: BatchStatus, code: str) -> None:
    job = cast(JobView, {"id": "job-1", "status": JobStatus.CANCELED})
    number, line, ok = job_line("batch_1", 7, ENTRY, Kind.CHAT, job, ending)
    assert (number, ok) == (7, False)
    assert _error(line)["code"] == code

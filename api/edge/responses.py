"""JSON responses serialised once with orjson (the hot paths skip FastAPI's re-validation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import Response

from shared.schemas import JobView


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code, headers, media_type="application/json")


def job_response(job: JobView, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A job as the job routes send it: the job store's view, encoded as is. The hot path and
    the FastAPI routes both answer through this, so a job reads the same bytes either way; the
    routes' `response_model=JobPublic` documents this shape (tests/api/routes/test_jobs.py checks it)."""
    return json_response(job, status_code, headers)

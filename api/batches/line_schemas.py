"""A batch's response-format schemas: each distinct one compiled once, when the batch is validated
(on validation's thread, in the API's compile processes: api/jobs/schema_compile.py), and the
verdicts of those that cannot be enforced kept in the file storage beside the batch's parts. The
feeder refuses their lines again by the schema's hash, and compiles nothing: a line whose schema
validation passed is submitted as it is."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from api.batches.filestore import FileStorage
from api.batches.lines import LineError, LineRequest
from api.jobs.schema_compile import SchemaChecker, schema_digest, schema_to_compile


def _digest(request: LineRequest) -> str | None:
    schema = schema_to_compile(request.create.response_format)
    return None if schema is None else schema_digest(schema)


def refusal(request: LineRequest, number: int, verdict: str) -> LineError:
    """The refusal of a line whose schema cannot be enforced."""
    return LineError(request.custom_id, "invalid_request", f"line {number}: response_format: {verdict}")


class BatchSchemas:
    """The schemas of one batch's lines, as validation meets them: each distinct one asked of the
    checker once; `refused` holds the verdicts of those refused, by schema hash. Blocking: for
    validation's thread."""

    def __init__(self, checker: SchemaChecker) -> None:
        self._checker = checker
        self._verdicts: dict[str, str | None] = {}
        self.refused: dict[str, str] = {}

    def check(self, request: LineRequest, number: int) -> LineError | None:
        """The line's refusal when its schema cannot be enforced."""
        digest = _digest(request)
        if digest is None:
            return None
        if digest not in self._verdicts:
            self._verdicts[digest] = self._checker.verdict(request.create.response_format)
        verdict = self._verdicts[digest]
        if verdict is None:
            return None
        self.refused[digest] = verdict
        return refusal(request, number, verdict)


def refused_again(request: LineRequest, number: int, refused: Mapping[str, str]) -> LineError | None:
    """The feeder's side: the line's refusal when validation refused its schema (a hash, no compile)."""
    digest = _digest(request) if refused else None
    verdict = None if digest is None else refused.get(digest)
    return None if verdict is None else refusal(request, number, verdict)


def refused_name(batch_id: str) -> str:
    """The storage name of a batch's refused schemas (a JSON object: hash -> why)."""
    return f"{batch_id}/schemas"


def write_refused(storage: FileStorage, batch_id: str, refused: Mapping[str, str]) -> None:
    """Keep the batch's refused schemas, if any. Blocking."""
    if refused:
        storage.put(refused_name(batch_id), [orjson.dumps(dict(refused))])


def read_refused(storage: FileStorage, batch_id: str) -> dict[str, str]:
    """The batch's refused schemas ({} when validation refused none). Blocking."""
    try:
        refused: dict[str, str] = orjson.loads(b"".join(storage.read(refused_name(batch_id))))
    except FileNotFoundError:
        return {}
    return refused

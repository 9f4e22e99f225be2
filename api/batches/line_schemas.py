"""A batch's response-format schemas: each distinct one compiled once, when the batch is validated
(on validation's thread, in the API's compile processes: api/jobs/schema_compile.py), and the
verdicts of those that cannot be enforced kept in the file storage beside the batch's parts. The
feeder refuses their lines again by the schema's hash, and compiles nothing: a line whose schema
validation passed is submitted as it is.

A batch carries at most GENQ_BATCH_SCHEMAS_MAX distinct schemas: the lines of any schema past
that are refused (`too_many_schemas`) without compiling, so one batch holds the compile pool for
a bounded time. What is kept per batch is bounded with them: at most that many hashes, each with
a verdict cut to a line error's length."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from api.batches.filestore import FileStorage
from api.batches.lines import MESSAGE_MAX, LineError, LineRequest
from api.jobs.schema_compile import SchemaChecker, schema_digest, schema_to_compile

#: The error code of a line whose schema is past the batch's bound on distinct schemas.
TOO_MANY_SCHEMAS = "too_many_schemas"


def _digest(request: LineRequest) -> str | None:
    schema = schema_to_compile(request.create.response_format)
    return None if schema is None else schema_digest(schema)


def refusal(request: LineRequest, number: int, verdict: str) -> LineError:
    """The refusal of a line whose schema cannot be enforced."""
    return LineError(request.custom_id, "invalid_request", f"line {number}: response_format: {verdict}")


def too_many(request: LineRequest, number: int, most: int) -> LineError:
    """The refusal of a line whose schema is one more than its batch may carry."""
    message = (
        f"line {number}: response_format: the batch already carries {most} distinct JSON schemas, "
        "the most one batch may (GENQ_BATCH_SCHEMAS_MAX)"
    )
    return LineError(request.custom_id, TOO_MANY_SCHEMAS, message)


@dataclass(frozen=True, slots=True)
class KeptSchemas:
    """What validation kept of a batch's schemas, for the feeder: the verdicts of those refused,
    by hash; and, when the batch reached its bound, the hashes that passed (any other schema is
    one too many) and the bound."""

    refused: dict[str, str] = field(default_factory=dict)
    passed: frozenset[str] | None = None
    most: int = 0

    def refusal(self, request: LineRequest, number: int) -> LineError | None:
        """The line's refusal when validation refused its schema (a hash, no compile)."""
        if not self.refused and self.passed is None:
            return None
        digest = _digest(request)
        if digest is None:
            return None
        if digest in self.refused:
            return refusal(request, number, self.refused[digest])
        if self.passed is not None and digest not in self.passed:
            return too_many(request, number, self.most)
        return None

    def content(self) -> bytes:
        passed = None if self.passed is None else sorted(self.passed)
        return orjson.dumps({"refused": self.refused, "passed": passed, "most": self.most})

    @classmethod
    def of(cls, content: bytes) -> KeptSchemas:
        kept = orjson.loads(content)
        passed = kept["passed"]
        return cls(kept["refused"], None if passed is None else frozenset(passed), kept["most"])


class BatchSchemas:
    """The schemas of one batch's lines, as validation meets them: each distinct one asked of the
    checker once, up to `most` of them; `kept()` is what the feeder needs of them. Blocking: for
    validation's thread."""

    def __init__(self, checker: SchemaChecker, most: int) -> None:
        self._checker = checker
        self._most = most
        self._verdicts: dict[str, str | None] = {}
        self._capped = False

    def check(self, request: LineRequest, number: int) -> LineError | None:
        """The line's refusal when its schema cannot be enforced or is one too many."""
        digest = _digest(request)
        if digest is None:
            return None
        if digest not in self._verdicts:
            if len(self._verdicts) >= self._most:
                self._capped = True
                return too_many(request, number, self._most)
            verdict = self._checker.verdict(request.create.response_format)
            self._verdicts[digest] = None if verdict is None else verdict[:MESSAGE_MAX]
        verdict = self._verdicts[digest]
        return None if verdict is None else refusal(request, number, verdict)

    def kept(self) -> KeptSchemas:
        refused = {digest: verdict for digest, verdict in self._verdicts.items() if verdict is not None}
        if not self._capped:
            return KeptSchemas(refused)
        passed = frozenset(digest for digest, verdict in self._verdicts.items() if verdict is None)
        return KeptSchemas(refused, passed, self._most)


def refused_again(request: LineRequest, number: int, kept: KeptSchemas) -> LineError | None:
    """The feeder's side: the line's refusal when validation refused its schema (a hash, no compile)."""
    return kept.refusal(request, number)


def refused_name(batch_id: str) -> str:
    """The storage name of what validation kept of a batch's schemas (KeptSchemas.content)."""
    return f"{batch_id}/schemas"


def write_refused(storage: FileStorage, batch_id: str, kept: KeptSchemas) -> int:
    """Keep what the feeder needs of the batch's schemas, if anything; the bytes written. Blocking."""
    if not kept.refused and kept.passed is None:
        return 0
    return storage.put(refused_name(batch_id), [kept.content()])


def read_refused(storage: FileStorage, batch_id: str) -> KeptSchemas:
    """What validation kept of the batch's schemas (nothing when it refused none). Blocking."""
    try:
        return KeptSchemas.of(b"".join(storage.read(refused_name(batch_id))))
    except FileNotFoundError:
        return KeptSchemas()

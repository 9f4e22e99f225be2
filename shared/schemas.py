"""The API's data model: job statuses, the job a client submits, the job it reads back.

Pydantic at the HTTP edge; the job's spec (its input) is shared/jobspec.py's, and the job store
(shared/jobqueue/records.py) converts between these and Redis hashes.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from typing_extensions import TypedDict as ModelTypedDict

# The spec's ChatMessage, Priority and WebhookEvent, importable from here as they always were.
from shared.jobspec import ChatMessage as ChatMessage  # noqa: PLC0414
from shared.jobspec import JobFields, JobSpec, MaxTokens
from shared.jobspec import Priority as Priority  # noqa: PLC0414
from shared.jobspec import WebhookEvent as WebhookEvent  # noqa: PLC0414


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})


MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class JobCreate(JobFields):
    """The body of POST /v1/jobs: the job's spec (shared/jobspec.py), the model it runs on and the
    caller's metadata. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    #: null: the server's default (GENQ_DEFAULT_MAX_TOKENS), capped by GENQ_MAX_TOKENS_CAP.
    max_tokens: MaxTokens | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] = Field(
        default_factory=dict, json_schema_extra={"default": {}}
    )

    def spec(self, max_tokens: int) -> JobSpec:
        """The job's spec as stored: this body without model and metadata (JobSpec ignores
        them), max_tokens resolved. Its values, validated already, pass pydantic's core again as
        they are: several times cheaper than model_construct's loop in Python over every field."""
        return JobSpec.model_validate({**self.__dict__, "max_tokens": max_tokens})


# A job's output, one shape: the worker builds it (workers/records.py), the record holds it as JSON
# (shared/jobqueue/records.py), a read returns it decoded (JobView) and the API's schema documents it
# (JobPublic). TypedDicts, not models: a worker's output can hold thousands of log-probability
# entries, which a model would build and validate one by one for no gain (the worker made them).
# typing_extensions' TypedDict: pydantic reads only that one on Python < 3.12.


class Usage(ModelTypedDict):
    prompt_tokens: int
    completion_tokens: int
    #: Of prompt_tokens, those whose KV cells the worker's prefix cache held (the chat template's
    #: head, a conversation's earlier turns): not computed again. 0 where the backend has no prefix
    #: cache; absent in records written before it was counted.
    cached_prompt_tokens: NotRequired[int]


class TopLogprob(ModelTypedDict):
    id: int
    token: str
    logprob: float


class TokenLogprob(ModelTypedDict):
    """A token with its log-probability under the model (raw: before penalties and temperature)."""

    id: int
    #: The token alone, decoded.
    token: str
    #: What the token added to the text (the texts of all tokens concatenate to it).
    text: str
    #: null for a prompt's first token (nothing precedes it).
    logprob: float | None
    top_logprobs: list[TopLogprob]


class JobChoice(ModelTypedDict):
    """One of a job's completions when it asked for n or best_of."""

    text: str
    finish_reason: Literal["stop", "length"]
    completion_tokens: int
    logprobs: NotRequired[list[TokenLogprob]]


class JobOutput(ModelTypedDict):
    text: str
    finish_reason: Literal["stop", "length"]
    usage: Usage
    #: With `logprobs`: one entry per generated token.
    logprobs: NotRequired[list[TokenLogprob]]
    #: With `prompt_logprobs`: one entry per prompt token (after the chat template, if any).
    prompt_logprobs: NotRequired[list[TokenLogprob]]
    #: With n or best_of > 1: every completion returned (text and finish_reason above are the first's;
    #: usage counts every sample generated).
    choices: NotRequired[list[JobChoice]]


class JobError(BaseModel):
    type: str
    message: str


class JobMetrics(BaseModel):
    queue_ms: float | None = None
    inference_ms: float | None = None
    batch_size: int | None = None


class JobUrls(BaseModel):
    get: str
    cancel: str
    stream: str


class JobPublic(BaseModel):
    """A job as every read of it returns it."""

    id: str
    status: JobStatus
    model: str
    #: What actually ran the job, e.g. "random weights" or "placeholder"; null until a worker took it.
    model_label: str | None
    input: JobSpec
    output: JobOutput | None
    error: JobError | None
    created_at: str
    started_at: str | None
    completed_at: str | None
    metrics: JobMetrics
    cached: bool
    metadata: dict[str, str]
    urls: JobUrls


class JobSummary(BaseModel):
    """A job as lists return it: no input, output or metrics (GET /v1/jobs/{id} has them)."""

    id: str
    status: JobStatus
    model: str
    model_label: str | None
    #: The first 120 characters of the prompt, or of the last message.
    preview: str
    error: JobError | None
    created_at: str
    started_at: str | None
    completed_at: str | None
    cached: bool
    metadata: dict[str, str]
    urls: JobUrls


class JobUrlsView(TypedDict):
    get: str
    cancel: str
    stream: str


class JobMetricsView(TypedDict):
    queue_ms: float | None
    inference_ms: float | None
    batch_size: int | None


class JobErrorView(TypedDict):
    type: str
    message: str


class JobCoreView(TypedDict):
    """What a job's every view shows, as the job store builds it (shared/jobqueue/records.py)."""

    id: str
    status: JobStatus
    model: str
    model_label: str | None
    error: JobErrorView | None
    created_at: str
    started_at: str | None
    completed_at: str | None
    cached: bool
    metadata: dict[str, str]
    urls: JobUrlsView


class JobSummaryView(JobCoreView):
    """A job as lists return it (JobSummary documents it)."""

    preview: str


class JobView(JobCoreView):
    """A job as every read of it returns it (JobPublic documents it). `input` and `output` are
    the JSON the job store holds (of JobInput's and JobOutput's shapes) as decoded, not
    re-validated: both ways of serving a job (api/edge/hotpath.py, the FastAPI routes) send this one
    value through one encoder (api/edge/responses.py)."""

    input: dict[str, Any]
    output: JobOutput | None
    metrics: JobMetricsView


class JobList(BaseModel):
    data: list[JobSummary]
    next_cursor: str | None


class ErrorDetail(BaseModel):
    type: str
    message: str
    param: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_body(type_: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, "param": param}}

"""The API's data model: job statuses, the job a client submits, the job it reads back.

Pydantic at the HTTP edge; the job store converts between these and Redis hashes.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})


class Priority(enum.StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def broker_priority(self) -> int:
        """kombu's Redis priority step: 0 is served first."""
        return 0 if self is Priority.INTERACTIVE else 9


class WebhookEvent(enum.StrEnum):
    START = "start"
    OUTPUT = "output"
    COMPLETED = "completed"


MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: Annotated[str, StringConstraints(max_length=200_000)]


class JobCreate(BaseModel):
    """The body of POST /v1/jobs. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    prompt: Annotated[str, StringConstraints(min_length=1, max_length=200_000)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)] | None = None
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    # Mutable defaults as factories: a literal [] or {} default is deep-copied for every request.
    stop: Annotated[list[StopString], Field(max_length=4)] = Field(
        default_factory=list, json_schema_extra={"default": []}
    )
    priority: Priority = Priority.INTERACTIVE
    webhook: AnyHttpUrl | None = None
    webhook_events_filter: Annotated[list[WebhookEvent], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: [WebhookEvent.COMPLETED], json_schema_extra={"default": ["completed"]}
    )
    cache: bool = True
    #: When the model's queue is full, run on the configured fallback model instead of a 503.
    allow_fallback: bool = False
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] = Field(
        default_factory=dict, json_schema_extra={"default": {}}
    )

    @field_validator("webhook")
    @classmethod
    def _webhook_is_http(cls, url: AnyHttpUrl | None) -> AnyHttpUrl | None:
        if url is not None and len(str(url)) > 2048:
            raise ValueError("webhook URL is longer than 2048 characters")
        return url

    @model_validator(mode="after")
    def _exactly_one_input(self) -> JobCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self


class JobInput(BaseModel):
    """The job's input as accepted: JobCreate with every default filled in."""

    prompt: str | None
    messages: list[ChatMessage] | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    priority: Priority
    webhook: str | None
    webhook_events_filter: list[WebhookEvent]
    cache: bool
    allow_fallback: bool


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class JobOutput(BaseModel):
    text: str
    finish_reason: Literal["stop", "length"]
    usage: Usage


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
    input: JobInput
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

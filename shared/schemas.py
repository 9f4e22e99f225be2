"""The API's data model: job statuses, the job a client submits, the job it reads back.

Pydantic at the HTTP edge; the job store converts between these and Redis hashes.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, TypedDict

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.structured import ResponseFormat


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
#: How a `prompt` becomes tokens: "chat" wraps it as one user message of the model's chat template
#: (what an instruct model expects), "none" continues the text verbatim (OpenAI's /v1/completions).
PromptTemplate = Literal["chat", "none"]
#: Bounded so any value survives JSON encoding (no vocabulary is near 2**31).
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
LogitBias = Annotated[float, Field(ge=-100.0, le=100.0)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: Annotated[str, StringConstraints(max_length=200_000)]


class JobCreate(BaseModel):
    """The body of POST /v1/jobs. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    prompt: Annotated[str, StringConstraints(min_length=1, max_length=200_000)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)] | None = None
    #: "chat" (default) wraps a `prompt` in the chat template; "none" continues it verbatim.
    template: PromptTemplate = "chat"
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    #: 0 only with prompt_logprobs (scoring a prompt, generating nothing).
    max_tokens: int | None = Field(None, ge=0)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    # Mutable defaults as factories: a literal [] or {} default is deep-copied for every request.
    stop: Annotated[list[StopString], Field(max_length=4)] = Field(
        default_factory=list, json_schema_extra={"default": []}
    )
    #: OpenAI's: subtracted once from the logit of every token the completion already holds.
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    #: OpenAI's: subtracted from a token's logit per occurrence in the completion so far.
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    #: vLLM's: > 1 discourages tokens seen in prompt or completion, < 1 encourages them.
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    #: OpenAI's: token id -> bias added to its logit (-100 bans it, 100 all but forces it).
    logit_bias: Annotated[dict[TokenId, LogitBias], Field(max_length=300)] = Field(
        default_factory=dict, json_schema_extra={"default": {}}
    )
    #: vLLM's: end-of-sequence and stop strings are ignored until this many tokens (<= max_tokens).
    min_tokens: int = Field(0, ge=0, le=1_000_000)
    #: Return each generated token's log-probability with this many most likely alternatives.
    logprobs: int | None = Field(None, ge=0, le=20)
    #: The same for each prompt token (the first has none); max_tokens 0 then only scores the prompt.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    #: Free text (null or type text), any JSON object (json_object), or JSON matching a schema.
    response_format: ResponseFormat | None = None
    #: Completions to return, each its own sample (usage counts them all).
    n: int = Field(1, ge=1, le=16)
    #: Completions to generate, of which the n most likely (cumulative log-probability) are returned.
    best_of: int | None = Field(None, ge=1, le=16)
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

    @field_validator("template")
    @classmethod
    def _template_for_prompt(cls, template: PromptTemplate, info: ValidationInfo) -> PromptTemplate:
        if template == "none" and info.data.get("messages") is not None:
            raise ValueError("'none' applies to a `prompt`; `messages` always use the chat template")
        return template

    @field_validator("best_of")
    @classmethod
    def _best_of_covers_n(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if best_of is not None and best_of < n:
            raise ValueError(f"best_of ({best_of}) must be at least n ({n})")
        return best_of

    @field_validator("webhook")
    @classmethod
    def _webhook_is_http(cls, url: AnyHttpUrl | None) -> AnyHttpUrl | None:
        if url is not None and len(str(url)) > 2048:
            raise ValueError("webhook URL is longer than 2048 characters")
        return url

    @property
    def rows(self) -> int:
        """Sequences the engine runs for the job (best_of, else n): what it costs wherever
        capacity is counted (rate limit, live-job bound, batch share), as n slots of a worker."""
        return max(self.n, self.best_of or 1)

    @model_validator(mode="after")
    def _exactly_one_input(self) -> JobCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self


class JobInput(BaseModel):
    """The job's input as accepted: JobCreate with every default filled in."""

    prompt: str | None
    messages: list[ChatMessage] | None
    #: Defaulted: jobs stored before the field existed were all chat-wrapped.
    template: PromptTemplate = "chat"
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    # Defaulted: jobs stored before these fields existed asked for none of them.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = Field(default_factory=dict)
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    n: int = 1
    best_of: int | None = None
    priority: Priority
    webhook: str | None
    webhook_events_filter: list[WebhookEvent]
    cache: bool
    allow_fallback: bool


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    #: Of prompt_tokens, those whose KV cells the worker's prefix cache held (the chat template's
    #: head, a conversation's earlier turns): not computed again. 0 where the backend has no prefix
    #: cache (and in records written before it was counted).
    cached_prompt_tokens: int = 0


class TopLogprob(BaseModel):
    id: int
    token: str
    logprob: float


class TokenLogprob(BaseModel):
    """A token with its log-probability under the model (raw: before penalties and temperature)."""

    id: int
    #: The token alone, decoded.
    token: str
    #: What the token added to the text (the texts of all tokens concatenate to it).
    text: str
    #: null for a prompt's first token (nothing precedes it).
    logprob: float | None
    top_logprobs: list[TopLogprob]


class JobChoice(BaseModel):
    """One of a job's completions when it asked for n or best_of."""

    text: str
    finish_reason: Literal["stop", "length"]
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None


class JobOutput(BaseModel):
    text: str
    finish_reason: Literal["stop", "length"]
    usage: Usage
    #: With `logprobs`: one entry per generated token.
    logprobs: list[TokenLogprob] | None = None
    #: With `prompt_logprobs`: one entry per prompt token (after the chat template, if any).
    prompt_logprobs: list[TokenLogprob] | None = None
    #: With n or best_of > 1: every completion returned (text and finish_reason above are the first's;
    #: usage counts every sample generated).
    choices: list[JobChoice] | None = None


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
    """What a job's every view shows, as the job store builds it (shared/store.py)."""

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
    output: dict[str, Any] | None
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

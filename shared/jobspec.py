"""A job's spec, declared once: its sampling parameters and its input, each field with its bounds,
default and meaning.

Everything else derives from these classes: POST /v1/jobs's body (shared/schemas.py JobCreate adds
the model and metadata), the OpenAI routes' request models (api/openai/requests.py inherits
CommonSampling), the job's record (shared/jobqueue/records.py encodes and decodes JobSpec), the response-cache
key (shared/cache.py hashes every Sampling field) and the engine (workers/engine/types.py
SamplingParams is Sampling plus what only the engine sets). Adding a sampling field is a line here
and its use in the sampler.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.structured import ResponseFormat, schema_of


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


#: Most alternatives a token's log-probability entry may list (OpenAI's chat top_logprobs bound).
MAX_TOP_LOGPROBS = 20

StopString = Annotated[str, StringConstraints(min_length=1, max_length=64)]
#: How a `prompt` becomes tokens: "chat" wraps it as one user message of the model's chat template
#: (what an instruct model expects), "none" continues the text verbatim (OpenAI's /v1/completions).
PromptTemplate = Literal["chat", "none"]
#: Bounded so any value survives JSON encoding (no vocabulary is near 2**31).
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
LogitBias = Annotated[float, Field(ge=-100.0, le=100.0)]
#: The types of the fields whose request models differ only in their default (OpenAI's temperature
#: is 1) or in meaning None (the server's default length): their bounds are declared here, once.
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
MaxTokens = Annotated[int, Field(ge=0)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]
BestOf = Annotated[int, Field(ge=1, le=16)]


class CommonSampling(BaseModel):
    """The sampling fields OpenAI-compatible servers (OpenAI's API, vLLM) take under the same name,
    meaning and default: the OpenAI routes' request models inherit them, so a field added here is
    taken there too, and passed to the job as it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: 0 is greedy (genq's default; OpenAI's routes default to 1, as OpenAI does).
    temperature: Temperature = 0.0
    #: Nucleus sampling: draw from the likeliest tokens whose probabilities add up to top_p.
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    #: vLLM's: draw from the top_k likeliest tokens only (before top_p); 0 or -1 (vLLM's "off",
    #: read as 0): every token. Bounded above any vocabulary.
    top_k: Annotated[int, Field(ge=-1, le=1 << 20), AfterValidator(lambda k: max(k, 0))] = 0
    #: A sampled job's generator seed: the same seed, prompt and model give the same text.
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
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
    #: Completions to return, each its own sample (usage counts them all).
    n: int = Field(1, ge=1, le=16)


class SamplingFields(CommonSampling):
    """Every sampling parameter but max_tokens, whose request form (null: the server's default)
    differs from the job's (a number): Sampling and JobSpec add it as the job has it, JobCreate as
    a request gives it."""

    #: Generation ends before the first of these strings (which the text leaves out).
    stop: Annotated[tuple[StopString, ...], Field(max_length=4)] = ()
    #: Return each generated token's log-probability with this many most likely alternatives.
    logprobs: TopLogprobs | None = None
    #: The same for each prompt token (the first has none); max_tokens 0 then only scores the prompt.
    prompt_logprobs: TopLogprobs | None = None
    #: Completions to generate, of which the n most likely (cumulative log-probability) are returned.
    best_of: BestOf | None = None

    @field_validator("best_of")
    @classmethod
    def _best_of_covers_n(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if best_of is not None and best_of < n:
            raise ValueError(f"best_of ({best_of}) must be at least n ({n})")
        return best_of

    @property
    def rows(self) -> int:
        """Sequences the engine runs for the job (best_of, else n): what it costs wherever
        capacity is counted (rate limit, live-job bound, batch share), as n slots of a worker."""
        return max(self.n, self.best_of or 1)

    def length_error(self, max_tokens: int) -> tuple[str, str] | None:
        """(field, message) when `max_tokens` (the job's, defaults resolved) does not fit the other
        fields: 0 without prompt_logprobs generates nothing, and min_tokens may not exceed it."""
        if max_tokens == 0 and self.prompt_logprobs is None:
            return "max_tokens", "max_tokens 0 generates nothing: it is allowed only with prompt_logprobs"
        if self.min_tokens > max_tokens:
            return "min_tokens", f"min_tokens ({self.min_tokens}) is more than max_tokens ({max_tokens})"
        return None


class Sampling(SamplingFields):
    """How a job's tokens are chosen: every sampling parameter, validated as the object is built.
    The engine's SamplingParams is this class plus what only the engine sets."""

    #: Tokens to generate at most; 0 only with prompt_logprobs (scoring a prompt, generating nothing).
    max_tokens: MaxTokens


def _within_2048(url: AnyHttpUrl | None) -> AnyHttpUrl | None:
    if url is not None and len(str(url)) > 2048:
        raise ValueError("webhook URL is longer than 2048 characters")
    return url


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: Annotated[str, StringConstraints(max_length=200_000)]


class JobFields(SamplingFields):
    """A job's input but max_tokens: what it generates from, how, and who hears of it."""

    prompt: Annotated[str, StringConstraints(min_length=1, max_length=200_000)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)] | None = None
    #: "chat" (default) wraps a `prompt` in the chat template; "none" continues it verbatim.
    template: PromptTemplate = "chat"
    #: Free text (null or type text), any JSON object (json_object), or JSON matching a schema.
    response_format: ResponseFormat | None = None
    priority: Priority = Priority.INTERACTIVE
    webhook: Annotated[AnyHttpUrl | None, AfterValidator(_within_2048)] = None
    # Mutable defaults as factories: a literal [] default is deep-copied for every request.
    webhook_events_filter: Annotated[list[WebhookEvent], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: [WebhookEvent.COMPLETED], json_schema_extra={"default": ["completed"]}
    )
    cache: bool = True
    #: When the model's queue is full, run on the configured fallback model instead of a 503.
    allow_fallback: bool = False

    @field_validator("template")
    @classmethod
    def _template_for_prompt(cls, template: PromptTemplate, info: ValidationInfo) -> PromptTemplate:
        if template == "none" and info.data.get("messages") is not None:
            raise ValueError("'none' applies to a `prompt`; `messages` always use the chat template")
        return template

    @model_validator(mode="after")
    def _exactly_one_input(self) -> JobFields:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self

    @property
    def json_schema(self) -> str | None:
        """The JSON schema (serialized) response_format asks every completion to match; None for
        free text. What the engine enforces and the cache key hashes."""
        return schema_of(self.response_format)


class JobSpec(JobFields, Sampling):
    """A job's input as accepted (every default filled in, max_tokens resolved) and stored: what a
    worker runs. Fields a record lacks (it was stored before they existed) read as their defaults;
    fields it has that this version does not know are ignored."""

    model_config = ConfigDict(extra="ignore")

"""OpenAI's completion requests, and the genq job each asks for (`job_create`).

The spec's sampling fields OpenAI's API (or vLLM's, as extra fields) takes as genq does
(shared/jobspec.py CommonSampling: penalties, logit_bias, vLLM's repetition_penalty and
min_tokens, n, ...) are inherited and passed to the job as they are; logprobs, chat's
top_logprobs, completions' echo and best_of, stop and response_format (json_object, json_schema)
are mapped onto the job's. Fields that configure OpenAI's platform (NO_EFFECT: store, service_tier, ...) are
accepted without effect. Those that would change the answer and are not honoured (echo or best_of
on chat, tools, ...), and any field genq does not know, are refused with 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.openai.kind import Kind
from shared import errors
from shared.jobspec import BestOf, CommonSampling, MaxTokens, Temperature, TopLogprobs
from shared.schemas import JobCreate, Priority

#: OpenAI fields genq cannot honour, with the values that ask for nothing (so are accepted).
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),  # chat only: /v1/completions honours it
    "echo": (None, False),  # chat only: /v1/completions honours it
    "top_logprobs": (None, 0),  # completions only: chat honours it
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False


class TextPart(BaseModel):
    """A content part of a chat message; genq's models read text only."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def as_chat_message(self) -> dict[str, str]:
        """The message as JobCreate takes it: validated there, with the rest of the job, so a
        message it refuses (content too long) is a 400 naming the message."""
        content = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        )
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class OpenAIRequest(CommonSampling):
    """The fields both completion endpoints share: CommonSampling's (the spec's sampling fields
    OpenAI's API takes as genq does; temperature defaults to 1, as OpenAI's), and those whose
    shape differs. Other fields are kept to be checked."""

    model_config = ConfigDict(extra="allow", frozen=False)

    model: str | None = Field(None, min_length=1, max_length=200)
    #: 0 only with completions' echo (scoring the prompt, as lm-evaluation-harness does).
    max_tokens: MaxTokens | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: Temperature = 1.0
    stop: str | list[str] | None = None
    #: Its shape is checked by JobCreate, its schema compiled once the caller is known (the routes):
    #: a bad one is a 400 naming response_format.
    response_format: dict[str, Any] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, body: Any) -> Any:
        """A sampling field sent as null asks for its default, as OpenAI's API reads it."""
        if not isinstance(body, dict):
            return body
        return {name: value for name, value in body.items() if value is not None or name not in _SAMPLING}


#: The sampling fields the OpenAI requests take from the spec, passed to the job as they are.
_SAMPLING = frozenset(CommonSampling.model_fields)


class ChatCompletionRequest(OpenAIRequest):
    messages: list[OpenAIMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None


class CompletionRequest(OpenAIRequest):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    best_of: BestOf | None = None


def shows_logprobs(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether the response carries log-probabilities (chat: `logprobs: true`; text: any number)."""
    return bool(body.logprobs) if isinstance(body, ChatCompletionRequest) else body.logprobs is not None


def echoes(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return isinstance(body, CompletionRequest) and bool(body.echo)


def _logprob_fields(body: ChatCompletionRequest | CompletionRequest) -> dict[str, int]:
    """The job's logprobs / prompt_logprobs for OpenAI's logprobs, top_logprobs and echo."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs and not body.logprobs:
            raise errors.InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return {"logprobs": body.top_logprobs or 0} if body.logprobs else {}
    fields = {} if body.logprobs is None else {"logprobs": body.logprobs}
    if body.echo:  # the prompt's tokens are scored too (a max_tokens 0 job needs them)
        fields["prompt_logprobs"] = body.logprobs or 0
    elif body.max_tokens == 0:
        raise errors.InvalidRequest(
            "max_tokens 0 generates nothing; it is allowed with echo", param="max_tokens"
        )
    return fields


#: OpenAI fields that configure its platform, not the generation: accepted, without effect.
NO_EFFECT = frozenset({"store", "service_tier", "metadata", "parallel_tool_calls", "safety_identifier",
                       "prompt_cache_key"})  # fmt: skip


def _refuse_unsupported(body: OpenAIRequest) -> None:
    """A field genq cannot honour is a 400 naming it, never silently dropped: an OpenAI field asking
    for something (NEUTRAL_VALUES), or any field genq does not know (as OpenAI's own API does)."""
    for name, value in (body.model_extra or {}).items():
        if name in NEUTRAL_VALUES and value not in NEUTRAL_VALUES[name]:
            raise errors.InvalidRequest(f"{name} is not supported by this server", param=name)
        if name not in NEUTRAL_VALUES and name not in NO_EFFECT:
            raise errors.InvalidRequest(f"{name} is not a field this server knows", param=name)


def _prompt_text(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        raise errors.InvalidRequest(
            "prompt: give one string (batched prompts are not supported)", param="prompt"
        )
    return prompt[0]


def job_create(body: ChatCompletionRequest | CompletionRequest) -> JobCreate:
    """The genq job an OpenAI request asks for (OpenAI's defaults: temperature 1, top_p 1)."""
    _refuse_unsupported(body)
    fields: dict[str, object] = {name: getattr(body, name) for name in _SAMPLING} | {
        "model": body.model,
        "max_tokens": body.max_tokens if body.max_completion_tokens is None else body.max_completion_tokens,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop or [],
        "priority": Priority.INTERACTIVE,
        "metadata": {"source": (Kind.CHAT if isinstance(body, ChatCompletionRequest) else Kind.TEXT).source}
        | ({"user": body.user[:512]} if body.user else {}),
    }
    fields |= _logprob_fields(body)
    if body.response_format is not None:
        fields["response_format"] = body.response_format
    if isinstance(body, CompletionRequest) and body.best_of is not None:
        fields["best_of"] = body.best_of
    if isinstance(body, ChatCompletionRequest):
        fields["messages"] = [m.as_chat_message() for m in body.messages]
    else:  # a completion continues its prompt verbatim, as OpenAI's and vLLM's do
        fields["prompt"] = _prompt_text(body.prompt)
        fields["template"] = "none"
    try:
        return JobCreate.model_validate(fields)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise errors.InvalidRequest(f"{param}: {first.get('msg', 'invalid value')}", param=param) from exc

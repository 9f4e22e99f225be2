"""api/openai/requests.py: the genq job an OpenAI request asks for (`job_create`), with OpenAI's
defaults, and every field genq cannot honour refused with a 400 naming it (`param`), never
silently dropped. (That the honoured fields reach the model is tests/api/routes/test_openai_sampling.py's.)"""

from __future__ import annotations

from typing import Any

import pytest

from api.openai.requests import ChatCompletionRequest, CompletionRequest, echoes, job_create, shows_logprobs
from shared import errors
from shared.schemas import ChatMessage, Priority

USER = {"role": "user", "content": "Hi"}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [USER]} | fields)


def text(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "Once"} | fields)


def refused(body: ChatCompletionRequest | CompletionRequest) -> errors.InvalidRequest:
    with pytest.raises(errors.InvalidRequest) as refusal:
        job_create(body)
    return refusal.value


def test_a_chat_request_is_an_interactive_job_on_its_messages_with_openais_defaults() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},  # OpenAI's newer name for system
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
    ]
    job = job_create(chat(messages=messages, model="random-tiny", stop="\n", user="u" * 600))
    assert job.messages == [ChatMessage(role="system", content="Be brief."),
                            ChatMessage(role="user", content="Hi there")]  # fmt: skip
    assert (job.model, job.temperature, job.top_p, job.stop) == ("random-tiny", 1.0, 1.0, ("\n",))
    assert job.priority is Priority.INTERACTIVE and job.prompt is None
    assert job.metadata == {"source": "openai.chat.completions", "user": "u" * 512}


def test_a_completion_continues_its_prompt_verbatim() -> None:
    job = job_create(text(prompt=["Once upon"], temperature=0, stop=["."], seed=7))
    assert (job.prompt, job.template, job.messages) == ("Once upon", "none", None)
    assert (job.temperature, job.stop, job.seed) == (0.0, (".",), 7)
    assert job.metadata == {"source": "openai.completions"}


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert job_create(chat(max_tokens=50, max_completion_tokens=20)).max_tokens == 20
    assert job_create(chat(max_tokens=50)).max_tokens == 50


def test_sampling_fields_pass_to_the_job() -> None:
    job = job_create(
        text(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={"42": 1.5}, repetition_penalty=1.1,
             min_tokens=2, n=3, best_of=4, response_format={"type": "json_object"})
    )  # fmt: skip
    assert (job.presence_penalty, job.frequency_penalty) == (0.5, 0.25)
    assert job.logit_bias == {42: 1.5}  # keyed by token id
    assert (job.repetition_penalty, job.min_tokens, job.n, job.best_of) == (1.1, 2, 3, 4)
    assert job.response_format is not None and job.response_format.type == "json_object"


def test_logprobs_map_to_the_jobs_logprobs_and_prompt_logprobs() -> None:
    assert job_create(chat(logprobs=True, top_logprobs=3)).logprobs == 3
    assert job_create(chat(logprobs=True)).logprobs == 0  # the chosen token's only
    assert job_create(chat(logprobs=False)).logprobs is None
    assert job_create(text(logprobs=2)).logprobs == 2
    scoring = job_create(text(echo=True, logprobs=1, max_tokens=0))  # lm-evaluation-harness's loglikelihood
    assert (scoring.prompt_logprobs, scoring.max_tokens) == (1, 0)
    assert shows_logprobs(chat(logprobs=True)) and shows_logprobs(text(logprobs=0))
    assert not shows_logprobs(chat()) and not shows_logprobs(text())
    assert echoes(text(echo=True)) and not echoes(text()) and not echoes(chat())


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools", "not supported"),
        (chat(echo=True), "echo", "not supported"),  # completions only
        (chat(best_of=2), "best_of", "not supported"),
        (text(suffix="end"), "suffix", "not supported"),
        (text(top_logprobs=2), "top_logprobs", "not supported"),  # chat only
        (chat(colour="blue"), "colour", "not a field this server knows"),
        (chat(top_logprobs=2), "top_logprobs", "needs logprobs: true"),
        (text(max_tokens=0), "max_tokens", "allowed with echo"),
        (text(prompt=["a", "b"]), "prompt", "batched prompts are not supported"),
        (text(response_format={"type": "json_schema"}), "response_format", "json_schema"),
        (text(n=2, best_of=1), "best_of", "must be at least n"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_field_genq_cannot_honour_is_refused_naming_it(
    body: ChatCompletionRequest | CompletionRequest, param: str, message: str
) -> None:
    refusal = refused(body)
    assert refusal.param == param and message in refusal.message
    assert refusal.type == "invalid_request"  # OpenAI's shape: 400 invalid_request_error (test_errors.py)


def test_fields_that_ask_for_nothing_or_configure_openais_platform_are_accepted() -> None:
    job_create(chat(tools=[], tool_choice="none", echo=False, best_of=1, modalities=["text"]))
    job_create(chat(store=True, service_tier="auto", metadata={"a": "b"}, parallel_tool_calls=False))
    job_create(text(suffix="", top_logprobs=0))

"""api/openai/responses.py: a finished job as OpenAI's `chat.completion` / `text_completion`
object, the fields the official clients read (ids, usage, finish_reason, logprobs), and a job that
did not succeed as the error a client is answered with."""

from __future__ import annotations

import pytest

from api.openai.kind import Kind
from api.openai.responses import JobNotCompleted, completion
from shared import errors
from shared.schemas import JobErrorView, JobStatus
from tests.api.openai.conftest import CREATED, finished_job, sample, token


def test_a_chat_job_is_a_chat_completion() -> None:
    answer = completion(Kind.CHAT, finished_job(sample("Hello!", "stop")))
    assert answer == {
        "id": "chatcmpl-job-1",
        "object": "chat.completion",
        "created": CREATED,
        "model": "random-tiny",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hello!", "refusal": None},
            },
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 5,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 0},  # a record written before it was counted
        },
    }


def test_the_prompt_tokens_the_prefix_cache_held_are_openais_cached_tokens() -> None:
    job = finished_job(sample("Hello!"))
    assert job["output"] is not None
    job["output"]["usage"]["cached_prompt_tokens"] = 2
    assert completion(Kind.CHAT, job)["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


def test_a_text_job_is_a_text_completion_and_echo_puts_the_prompt_first() -> None:
    job = finished_job(sample(" hi", "length"), prompt="Say")
    answer = completion(Kind.TEXT, job)
    assert (answer["id"], answer["object"]) == ("cmpl-job-1", "text_completion")
    assert answer["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "length", "text": " hi"}]
    assert completion(Kind.TEXT, job, echo=True)["choices"][0]["text"] == "Say hi"


def test_n_completions_are_one_choice_each_with_its_own_finish_reason() -> None:
    answer = completion(Kind.CHAT, finished_job(sample("a", "stop"), sample("b c", "length")))
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, "a", "stop"),
        (1, "b c", "length"),
    ]
    assert answer["usage"]["total_tokens"] == 8  # the job's usage counts every choice's tokens


def test_chat_logprobs_have_openais_token_logprob_shape() -> None:
    job = finished_job(sample("é", logprobs=[token("é", -0.5, ("é", -0.5), ("e", -1.5))]))
    logprobs = completion(Kind.CHAT, job)["choices"][0]["logprobs"]
    assert logprobs == {
        "content": [
            {"token": "é", "logprob": -0.5, "bytes": [195, 169],
             "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]},
                              {"token": "e", "logprob": -1.5, "bytes": [101]}]},
        ],
        "refusal": None,
    }  # fmt: skip


def test_text_logprobs_are_parallel_lists_and_echo_scores_the_prompt_first() -> None:
    """The prompt's first token has no log-probability (nothing precedes it): null, as OpenAI's;
    text offsets run through the prompt into the completion; each top_logprobs holds the chosen token."""
    job = finished_job(
        sample(" hi", logprobs=[token(" hi", -0.2, (" yo", -1.0))]),
        prompt="Say",
        prompt_logprobs=[token("Say", None)],
    )
    assert completion(Kind.TEXT, job)["choices"][0]["logprobs"] == {
        "tokens": [" hi"], "token_logprobs": [-0.2], "top_logprobs": [{" yo": -1.0, " hi": -0.2}],
        "text_offset": [0],
    }  # fmt: skip
    echoed = completion(Kind.TEXT, job, echo=True)["choices"][0]
    assert echoed["text"] == "Say hi"
    assert echoed["logprobs"] == {
        "tokens": ["Say", " hi"], "token_logprobs": [None, -0.2],
        "top_logprobs": [None, {" yo": -1.0, " hi": -0.2}], "text_offset": [0, 3],
    }  # fmt: skip


def test_a_failed_job_is_a_server_error_with_its_error_type() -> None:
    error: JobErrorView = {"type": "engine_error", "message": "CUDA out of memory"}
    job = finished_job(status=JobStatus.FAILED, error=error)
    with pytest.raises(JobNotCompleted) as failed:
        completion(Kind.CHAT, job)
    assert (failed.value.type, failed.value.message) == ("engine_error", "CUDA out of memory")


def test_a_canceled_job_without_an_error_names_its_status() -> None:
    with pytest.raises(JobNotCompleted) as canceled:
        completion(Kind.TEXT, finished_job(status=JobStatus.CANCELED))
    assert (canceled.value.type, canceled.value.message) == ("canceled", "the job ended canceled")


def test_a_request_the_engine_refused_is_a_400() -> None:
    """A prompt too long for the model, found only by the worker: the client's mistake, not a 500."""
    refused = finished_job(status=JobStatus.FAILED, error={"type": "invalid_request", "message": "too long"})
    with pytest.raises(errors.InvalidRequest, match="too long"):
        completion(Kind.CHAT, refused)

"""workers/records.py: a stored job spec becomes the engine's request, and a result becomes
record fields that read back in the API's output shape."""

from __future__ import annotations

import time

import orjson
from pydantic import TypeAdapter

from shared.jobqueue.records import decode_input
from shared.schemas import JobMetrics, JobOutput, JobStatus
from workers.engine import GenerationResult
from workers.engine.types import OutputUpdate, TokenLogprob
from workers.records import generation_request, success_fields

#: An input as the API stored it before the spec (JobInput dumped to JSON: logit_bias keys strings).
STORED = {
    "prompt": "hi", "messages": None, "template": "none", "max_tokens": 5, "temperature": 0.7,
    "top_p": 0.9, "seed": 7, "stop": ["\n"], "presence_penalty": 0.5, "frequency_penalty": 0.25,
    "repetition_penalty": 1.1, "logit_bias": {"42": -100.0}, "min_tokens": 2, "logprobs": 3,
    "prompt_logprobs": None, "response_format": None, "n": 2, "best_of": 3,
}  # fmt: skip
#: An input stored before the sampling options beyond temperature and top_p existed.
OLD = {"prompt": None, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.0,
       "top_p": 1.0, "seed": None, "stop": []}  # fmt: skip


def test_a_stored_input_becomes_the_engines_request() -> None:
    updates: list[OutputUpdate] = []
    on_output = updates.append
    request = generation_request("j1", decode_input(orjson.dumps(STORED)), 30.0, on_output)
    params = request.params
    assert (request.request_id, request.prompt, request.messages, request.template) == (
        "j1",
        "hi",
        None,
        "none",
    )
    assert (params.max_tokens, params.temperature, params.top_p, params.seed, params.stop) == (
        5,
        0.7,
        0.9,
        7,
        ("\n",),
    )
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, 0.25, 1.1)
    assert params.logit_bias == {42: -100.0}  # token ids back to ints
    assert (params.min_tokens, params.logprobs, params.n, params.best_of) == (2, 3, 2, 3)
    assert request.deadline is not None and 29.0 < request.deadline - time.monotonic() <= 30.0
    assert request.on_output is on_output


def test_an_input_stored_before_the_newer_options_gets_their_defaults() -> None:
    request = generation_request("j1", decode_input(orjson.dumps(OLD)), 30.0, lambda _: None)
    params = request.params
    assert request.template == "chat" and request.messages == [{"role": "user", "content": "hi"}]
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (params.logit_bias, params.min_tokens, params.logprobs, params.json_schema) == ({}, 0, None, None)
    assert (params.n, params.best_of) == (1, None)


def test_a_result_becomes_the_fields_the_api_reads_back() -> None:
    token = TokenLogprob(
        token_id=5, token="Hi", text="Hi", logprob=-0.5, top=((5, "Hi", -0.5), (6, "Yo", -1.5))
    )
    other = GenerationResult("Yo", "length", 3, 1, 1.0, 2, 0.5)
    result = GenerationResult("Hi", "stop", 3, 2, 12.34567, 4, 0.5, logprobs=(token,), choices=(other,))
    fields = success_fields(result)
    assert fields["status"] == JobStatus.SUCCEEDED.value
    output = TypeAdapter(JobOutput).validate_json(fields["output"])  # the output's one shape
    assert (output["text"], output["finish_reason"], output["usage"]["completion_tokens"]) == (
        "Hi",
        "stop",
        2,
    )
    assert output["logprobs"][0]["top_logprobs"][1]["token"] == "Yo"
    assert [(c["text"], c["completion_tokens"]) for c in output["choices"]] == [("Yo", 1)]
    assert "prompt_logprobs" not in output and "logprobs" not in output["choices"][0]  # absent, not null
    metrics = JobMetrics.model_validate(orjson.loads(fields["metrics"]))
    assert (metrics.inference_ms, metrics.batch_size) == (12.346, 4)

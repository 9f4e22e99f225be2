"""The OpenAI fields that change generation reach the model: the official `openai` client against a
live server and a real worker on random-tiny (real forward passes, random weights)."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.shared_params import ResponseFormatJSONSchema

from cli.redis_server import EmbeddedRedis
from tests.api.live_server import served_model

pytestmark = pytest.mark.slow

MODEL = "random-tiny"
#: " cat" in SmolLM2's vocabulary (random-tiny's tokenizer). random-tiny's logits lie within +-0.7,
#: so a bias of 1.0 makes it every greedy step's choice.
CAT = 2644


@pytest.fixture(scope="module")
def base_url(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One worker on random-tiny and one live API for the module (a worker takes seconds to start)."""
    with served_model(redis_server.url, tmp_path_factory.mktemp("openai-sampling"), MODEL) as url:
        yield url


def test_penalties_logit_bias_and_raw_prompts_reach_the_model(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    common = {"model": MODEL, "prompt": "hello there", "max_tokens": 8, "temperature": 0}
    forced = client.completions.create(**common, logit_bias={str(CAT): 1.0})  # type: ignore[call-overload]
    assert forced.choices[0].text == " cat" * 8
    assert forced.usage is not None and forced.usage.prompt_tokens == 2  # verbatim: no chat template
    for penalty in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ):
        text = client.completions.create(**common, logit_bias={str(CAT): 1.0}, **penalty).choices[0].text  # type: ignore[call-overload]
        assert text.startswith(" cat") and text.count(" cat") <= 2, (penalty, text)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=4,
        temperature=0,
        logit_bias={str(CAT): 1.0},  # type: ignore[dict-item]  # genq takes float biases; the SDK types int
    )
    assert chat.choices[0].message.content == " cat" * 4


def test_the_jobs_api_takes_the_same_fields(base_url: str) -> None:
    body = {"prompt": "hello there", "max_tokens": 6, "logit_bias": {str(CAT): 1.0}}
    chat = httpx.post(f"{base_url}/v1/jobs", json=body, headers={"Prefer": "wait=60"}).json()
    raw = httpx.post(f"{base_url}/v1/jobs", json=body | {"template": "none", "min_tokens": 6},
                     headers={"Prefer": "wait=60"}).json()  # fmt: skip
    assert chat["output"]["text"] == raw["output"]["text"] == " cat" * 6
    assert chat["output"]["usage"]["prompt_tokens"] > raw["output"]["usage"]["prompt_tokens"] == 2
    assert raw["input"]["min_tokens"] == 6 and raw["input"]["logit_bias"] == {str(CAT): 1.0}


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_logprobs_plain_and_streamed(base_url: str) -> None:
    client = _client(base_url)
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0,
           "logprobs": True, "top_logprobs": 3}  # fmt: skip
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    content = whole.choices[0].logprobs.content
    assert whole.usage is not None and len(content) == whole.usage.completion_tokens == 6
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob)
        assert entry.logprob < 0 and entry.bytes == list(entry.token.encode())
    chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]  # type: ignore[call-overload]
    streamed = [entry for c in chunks if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_echo_scores_the_prompt_like_lm_eval_asks(base_url: str) -> None:
    client = _client(base_url)
    prompt = "The capital of France is Paris"
    scored = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == prompt and scored.usage is not None and scored.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert logprobs is not None and len(logprobs.tokens or []) == scored.usage.prompt_tokens
    assert logprobs.token_logprobs is not None and logprobs.token_logprobs[0] is None
    assert all(value < 0 for value in logprobs.token_logprobs[1:])
    assert logprobs.top_logprobs is not None and logprobs.top_logprobs[0] is None
    pairs = zip(logprobs.tokens or [], logprobs.text_offset or [], strict=True)
    assert all(prompt[offset:].startswith(token) for token, offset in pairs)
    # One more token, generated: the prompt's scores are the same numbers.
    more = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0
    )
    assert more.choices[0].logprobs is not None and more.choices[0].text.startswith(prompt)
    assert more.choices[0].logprobs.token_logprobs[: len(logprobs.tokens or [])] == logprobs.token_logprobs
    streamed = list(
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, echo=True, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed).startswith(prompt)


def test_n_completions_in_one_response_plain_and_streamed(base_url: str) -> None:
    client = _client(base_url)
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
           "temperature": 1.0, "seed": 11, "n": 3}  # fmt: skip
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    texts = [choice.message.content for choice in whole.choices]
    assert len(set(texts)) == 3  # three samples (seeds 11, 12, 13), not one copied
    assert whole.usage is not None and whole.usage.completion_tokens == 15
    chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]  # type: ignore[call-overload]
    streamed = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i) for i in range(3)
    ]
    assert streamed == texts
    finishes = sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason)
    assert finishes == [0, 1, 2]


def test_best_of_returns_the_most_likely_completions(base_url: str) -> None:
    client = _client(base_url)
    common = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": 5,
        "temperature": 1.0,
        "seed": 5,
        "logprobs": 0,
    }
    best = client.completions.create(**common, n=2, best_of=4)  # type: ignore[call-overload]
    every = client.completions.create(**common, n=4)  # type: ignore[call-overload]

    def total(choice: object) -> float:
        return sum(choice.logprobs.token_logprobs)  # type: ignore[attr-defined]

    ranked = sorted(every.choices, key=total, reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert best.usage is not None and best.usage.completion_tokens == 20  # all four samples count
    body = {"prompt": "hello", "n": 2, "temperature": 1.0, "seed": 5, "max_tokens": 3}
    job = httpx.post(f"{base_url}/v1/jobs", json=body, headers={"Prefer": "wait=60"}).json()
    assert [len(c["text"]) > 0 for c in job["output"]["choices"]] == [True, True]
    assert job["output"]["usage"]["completion_tokens"] == 6


#: The wire test's schema: compact (about 20 tokens an answer), so 200 answers stay quick; the
#: engine's test (tests/workers/engine/sampling/test_structured.py) runs 200 of a larger one.
COMPACT_SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
    },
    "required": ["colour", "age", "member"],
    "additionalProperties": False,
}


def test_structured_completions_through_the_openai_client_all_validate(base_url: str) -> None:
    """200 json_schema completions from 16 concurrent clients: every one parses and validates."""
    client = _client(base_url)
    response_format: ResponseFormatJSONSchema = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": COMPACT_SCHEMA, "strict": True},
    }

    def ask(index: int) -> tuple[str | None, str | None]:
        completion = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"person {index} as JSON"}],
            max_tokens=60,
            seed=index,
            response_format=response_format,
        )
        return completion.choices[0].message.content, completion.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(200)))
    for content, finish_reason in answers:
        assert finish_reason == "stop"
        jsonschema.validate(json.loads(content or ""), COMPACT_SCHEMA)
    assert len({content for content, _ in answers}) > 50  # sampled, not one answer repeated
    # json_object on random weights: "{" (107) and "}" (109) pushed hard, the grammar still decides.
    braces = {"107": 50, "109": 100}
    plain = client.completions.create(
        model=MODEL,
        prompt="x",
        max_tokens=8,
        logit_bias=braces,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert (plain.choices[0].text, plain.choices[0].finish_reason) == ("{}", "stop")


def _stream_while_running(
    base_url: str, create: object, ask: dict[str, object]
) -> tuple[list[object], dict[str, Any]]:
    """The chunks of a stream, the job's status when its first token chunk came, and the job at
    the end."""
    status = ""
    chunks: list[object] = []
    with create.with_streaming_response.create(**ask, stream=True) as raw:  # type: ignore[attr-defined]
        job_url = f"{base_url}/v1/jobs/{raw.headers['x-genq-job-id']}"
        for piece in raw.parse():
            chunks.append(piece)
            if not status and piece.choices and piece.choices[0].logprobs:
                status = httpx.get(job_url).json()["status"]
    return chunks, {"status_at_first_token": status, "job": httpx.get(job_url).json()}


def test_logprobs_and_n_stream_token_by_token_while_the_job_runs(base_url: str) -> None:
    """vLLM's chunk shapes: one choice per chunk with its index, each token's logprobs in its own
    chunk, sent as generated (the job is still running at the first one), and together exactly
    the job's stored result (what a non-streamed request gets)."""
    client = _client(base_url)
    ask = {"model": MODEL, "prompt": "hello", "max_tokens": 300, "temperature": 1.0, "seed": 7, "n": 2,
           "logprobs": 1, "extra_body": {"min_tokens": 300}}  # fmt: skip
    chunks, seen = _stream_while_running(base_url, client.completions, ask)
    assert seen["status_at_first_token"] == "running"
    for index, choice in enumerate(seen["job"]["output"]["choices"]):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]  # type: ignore[attr-defined]
        tokens = [c for c in mine if c.logprobs]
        assert all(len(c.logprobs.tokens) == 1 for c in tokens)  # one token per chunk
        assert "".join(c.text for c in mine) == choice["text"]
        pairs = (zip(c.logprobs.tokens, c.logprobs.token_logprobs, strict=True) for c in tokens)
        streamed = [pair for chunk_pairs in pairs for pair in chunk_pairs]
        assert streamed == [(entry["token"], entry["logprob"]) for entry in choice["logprobs"]]
        assert len(streamed) == 300
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
            "temperature": 1.0, "seed": 3, "n": 2, "logprobs": True, "top_logprobs": 2,
            "extra_body": {"min_tokens": 200}}  # fmt: skip
    chunks, seen = _stream_while_running(base_url, client.chat.completions, chat)
    assert seen["status_at_first_token"] == "running"
    for index in (0, 1):
        entries = [
            entry
            for c in chunks
            if c.choices and c.choices[0].index == index and c.choices[0].logprobs  # type: ignore[attr-defined]
            for entry in c.choices[0].logprobs.content  # type: ignore[attr-defined]
        ]
        assert len(entries) == 200 and all(len(entry.top_logprobs) == 2 for entry in entries)


def test_the_jobs_stream_carries_the_first_completion_live(base_url: str) -> None:
    """GET /v1/jobs/{id}/stream shows one text: with n, the first completion's (output.text)."""
    body = {"prompt": "hello", "template": "none", "n": 2, "temperature": 1.0, "seed": 9,
            "max_tokens": 200, "min_tokens": 200}  # fmt: skip
    job_id = httpx.post(f"{base_url}/v1/jobs", json=body).json()["id"]
    deltas: list[str] = []
    event, done = "", {}
    with httpx.stream("GET", f"{base_url}/v1/jobs/{job_id}/stream", timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "output":
                deltas.append(json.loads(line.removeprefix("data: "))["delta"])
            elif line.startswith("data: ") and event == "done":
                done = json.loads(line.removeprefix("data: "))
                break
    choices = done["output"]["choices"]
    assert "".join(deltas) == done["output"]["text"] == choices[0]["text"] != choices[1]["text"]
    assert len(deltas) > 1  # live deltas, not one piece at the end

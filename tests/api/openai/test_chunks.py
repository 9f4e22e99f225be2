"""api/openai/chunks.py: a job's output as OpenAI's stream chunks: chat's role chunk, text deltas,
the finish chunk and the usage chunk; live chunks that never repeat or lose text when the
finished job fills in what the stream lacked; and a finished job's chunks sent at once."""

from __future__ import annotations

from typing import Any

from api.jobs.follow import FINAL_ID, Output
from api.openai.chunks import LiveChunks, buffered_chunks, chunk, usage_chunk
from api.openai.kind import Kind
from tests.api.openai.conftest import CREATED, finished_job, sample, token


def deltas(chunks: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(choice index, text) of each chunk, chat's or text's."""
    out = []
    for body in chunks:
        (choice,) = body["choices"]  # every content chunk has one choice
        out.append((choice["index"], choice["delta"]["content"] if "delta" in choice else choice["text"]))
    return out


def test_a_chat_stream_starts_with_the_role_then_deltas_then_the_finish() -> None:
    job = finished_job(sample("Hi"))
    role, delta = chunk(Kind.CHAT, job, None, None, False), chunk(Kind.CHAT, job, "Hi", None, False)
    finish = chunk(Kind.CHAT, job, None, "stop", False)
    assert role == {
        "id": "chatcmpl-job-1", "object": "chat.completion.chunk", "created": CREATED, "model": "random-tiny",
        "system_fingerprint": None,
        "choices": [{"index": 0, "logprobs": None, "finish_reason": None,
                     "delta": {"role": "assistant", "content": ""}}],
    }  # fmt: skip
    assert delta["choices"][0]["delta"] == {"content": "Hi"}
    assert finish["choices"][0] == {"index": 0, "logprobs": None, "finish_reason": "stop", "delta": {}}
    assert "usage" not in role  # only when the request asked for stream_options.include_usage


def test_a_text_stream_chunk_carries_text() -> None:
    body = chunk(Kind.TEXT, finished_job(sample(" hi")), " hi", None, False, index=1)
    assert (body["id"], body["object"]) == ("cmpl-job-1", "text_completion")
    assert body["choices"] == [{"index": 1, "logprobs": None, "finish_reason": None, "text": " hi"}]


def test_with_include_usage_every_chunk_has_null_usage_and_the_last_has_it() -> None:
    job = finished_job(sample("Hi"))
    assert chunk(Kind.CHAT, job, "Hi", None, True)["usage"] is None
    last = usage_chunk(Kind.CHAT, job)
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert last["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_live_chunks_send_each_delta_and_the_job_sends_only_what_the_stream_lacked() -> None:
    """A stream entry lost (or not yet read) when the job ended: its text comes from the job,
    once; per completion (n)."""
    live = LiveChunks(Kind.CHAT, finished_job(sample("a")), logprobs=False, include_usage=False)
    sent = [*live.add(Output("1-0", "Hel", 1)), *live.add(Output("1-1", "", 1))]
    sent += live.add(Output("1-2", "x", 1, index=1))
    assert deltas(sent) == [(0, "Hel"), (1, "x")]
    assert live.add(Output(FINAL_ID, "", 0)) == []
    ended = finished_job(sample("Hello"), sample("xyz"), sample("new"))
    assert deltas(live.rest(ended)) == [(0, "lo"), (1, "yz"), (2, "new")]


def test_live_chunks_with_logprobs_are_one_per_token_never_repeated() -> None:
    first, second = token(" a", -0.1), token(" b", -0.2)
    live = LiveChunks(Kind.TEXT, finished_job(sample("")), logprobs=True, include_usage=False)
    (streamed,) = live.add(Output("1-0", " a", 1, logprobs=[first]))
    assert streamed["choices"][0]["logprobs"]["tokens"] == [" a"]
    (rest,) = live.rest(finished_job(sample(" a b", logprobs=[first, second])))
    assert rest["choices"][0]["text"] == " b"
    assert rest["choices"][0]["logprobs"]["text_offset"] == [2]  # after the streamed " a"


def test_buffered_chunks_echo_the_prompt_then_each_token() -> None:
    job = finished_job(
        sample(" hi yo", logprobs=[token(" hi", -0.1), token(" yo", -0.3)]),
        prompt="Say",
        prompt_logprobs=[token("Say", None)],
    )
    chunks = buffered_chunks(Kind.TEXT, job, logprobs=True, echo=True, include_usage=False)
    assert deltas(chunks) == [(0, "Say"), (0, " hi"), (0, " yo")]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in chunks] == [[0], [3], [6]]
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"] == [None]


def test_buffered_chunks_without_logprobs_are_each_completions_whole_text() -> None:
    job = finished_job(sample("one"), sample("two"))
    chunks = buffered_chunks(Kind.CHAT, job, logprobs=False, echo=False, include_usage=True)
    assert deltas(chunks) == [(0, "one"), (1, "two")]
    assert all(c["usage"] is None and c["choices"][0]["logprobs"] is None for c in chunks)

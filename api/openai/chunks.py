"""A job's output as OpenAI's stream chunks: live as the job publishes it (`LiveChunks`), or at
once from the finished job (`buffered_chunks`)."""

from __future__ import annotations

from typing import Any

from api.jobs.follow import FINAL_ID, Output
from api.openai.kind import Kind
from api.openai.responses import chat_logprob, envelope, output_of, samples, text_logprobs, usage_of
from shared.schemas import JobView, TokenLogprob


class LiveChunks:
    """A live stream's chunks, per completion (`index`, OpenAI's n): its text deltas as the job
    publishes them, or with logprobs one chunk per token with its entry; once the job ended, what
    the stream has not carried yet, from the finished job (whose entries repeat the streamed ones
    exactly: workers/engine/sampling/logprobs.describe_streamed)."""

    def __init__(self, kind: Kind, job: JobView, logprobs: bool, include_usage: bool) -> None:
        self._kind, self._job, self._logprobs, self._include_usage = kind, job, logprobs, include_usage
        self._texts: dict[int, str] = {}
        self._tokens: dict[int, int] = {}

    def add(self, output: Output) -> list[dict[str, Any]]:
        """The chunks of one stream entry (none for the text a stream lacked: rest() sends it)."""
        if output.id == FINAL_ID:
            return []
        if self._logprobs:
            return [self._token(output.index, entry) for entry in output.logprobs or []]
        return [self._text(output.index, output.delta)] if output.delta else []

    def rest(self, job: JobView) -> list[dict[str, Any]]:
        """A succeeded job's chunks the stream has not sent yet."""
        chunks: list[dict[str, Any]] = []
        for index, sample in enumerate(samples(job)):
            if self._logprobs:
                entries = (sample.get("logprobs") or [])[self._tokens.get(index, 0) :]
                chunks.extend(self._token(index, entry) for entry in entries)
                continue
            sent, text = self._texts.get(index, ""), sample["text"]
            if text.startswith(sent) and len(text) > len(sent):  # else the job's text is the authority
                chunks.append(self._text(index, text[len(sent) :]))
        return chunks

    def _token(self, index: int, entry: TokenLogprob) -> dict[str, Any]:
        sent = self._texts.get(index, "")
        self._texts[index] = sent + entry["text"]
        self._tokens[index] = self._tokens.get(index, 0) + 1
        text, usage = entry["text"], self._include_usage
        return _token_chunk(self._kind, self._job, index, text, [entry], len(sent), usage)

    def _text(self, index: int, delta: str) -> dict[str, Any]:
        self._texts[index] = self._texts.get(index, "") + delta
        return chunk(self._kind, self._job, delta, None, self._include_usage, index)


def buffered_chunks(
    kind: Kind, job: JobView, logprobs: bool, echo: bool, include_usage: bool
) -> list[dict[str, Any]]:
    """A succeeded job's stream chunks, sent once it ended (best_of's ranked samples, echo with
    logprobs): per completion (n), its echoed prompt, then one chunk per token with its logprobs,
    or its whole text in one chunk without them."""
    chunks = []
    prompt = job["input"]["prompt"] or ""
    for index, sample in enumerate(samples(job)):
        offset = 0
        if echo:
            scored = output_of(job).get("prompt_logprobs") or [] if logprobs else None
            chunks.append(_token_chunk(kind, job, index, prompt, scored, 0, include_usage))
            offset = len(prompt)
        if not logprobs:
            chunks.append(_token_chunk(kind, job, index, sample["text"], None, offset, include_usage))
            continue
        for token in sample["logprobs"]:
            chunks.append(_token_chunk(kind, job, index, token["text"], [token], offset, include_usage))
            offset += len(token["text"])
    return chunks


def _token_chunk(
    kind: Kind,
    job: JobView,
    index: int,
    text: str,
    tokens: list[TokenLogprob] | None,
    offset: int,
    include_usage: bool,
) -> dict[str, Any]:
    body = chunk(kind, job, text, None, include_usage, index)
    if tokens is not None:
        body["choices"][0]["logprobs"] = (
            {"content": [chat_logprob(token) for token in tokens], "refusal": None}
            if kind is Kind.CHAT
            else text_logprobs(tokens, offset)
        )
    return body


def chunk(
    kind: Kind,
    job: JobView,
    delta: str | None,
    finish_reason: str | None,
    include_usage: bool,
    index: int = 0,
) -> dict[str, Any]:
    """One stream chunk of choice `index`: the assistant role (chat, delta None), a text delta, or
    the finish."""
    choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": finish_reason}
    if kind is Kind.CHAT:
        choice["delta"] = {"role": "assistant", "content": ""} if delta is None else {"content": delta}
        if finish_reason is not None:
            choice["delta"] = {}
    else:
        choice["text"] = delta or ""
    body = envelope(kind, job, kind.chunk_obj) | {"choices": [choice]}
    return body | {"usage": None} if include_usage else body


def usage_chunk(kind: Kind, job: JobView) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return envelope(kind, job, kind.chunk_obj) | {"choices": [], "usage": usage_of(job)}

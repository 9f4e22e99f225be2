"""A finished genq job as OpenAI's completion object (`completion`), and the pieces of OpenAI's
response format its stream chunks share (api/openai/chunks.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from api.openai.kind import Kind
from shared import errors
from shared.schemas import JobChoice, JobOutput, JobStatus, JobView, TokenLogprob


class JobNotCompleted(errors.GenqError):
    """The job failed (other than the engine refusing the request: a 400) or was canceled:
    answered 500 `server_error`, `code` the job's error type."""

    def __init__(self, job: JobView) -> None:
        self.type, message = failure_of(job)
        super().__init__(message)


def failure_of(job: JobView) -> tuple[str, str]:
    """(type, message) of a job that did not succeed: its error's, else its status."""
    error = job["error"]
    type_ = (error and error["type"]) or job["status"].value
    return type_, (error and error["message"]) or f"the job ended {job['status']}"


def output_of(job: JobView) -> JobOutput:
    """A succeeded job's output (every succeeded job has one)."""
    output = job["output"]
    assert output is not None, f"succeeded job {job['id']} has no output"
    return output


def _created(job: JobView) -> int:
    return int(datetime.fromisoformat(job["created_at"].replace("Z", "+00:00")).timestamp())


def usage_of(job: JobView) -> dict[str, Any]:
    """OpenAI's usage object, prompt_tokens_details.cached_tokens included (the prefix cache's)."""
    usage = output_of(job)["usage"]
    prompt, completion_ = usage["prompt_tokens"], usage["completion_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_,
        "total_tokens": prompt + completion_,
        "prompt_tokens_details": {"cached_tokens": usage.get("cached_prompt_tokens", 0)},
    }


def envelope(kind: Kind, job: JobView, obj: str) -> dict[str, Any]:
    return {
        "id": kind.id_prefix + job["id"],
        "object": obj,
        "created": _created(job),
        "model": job["model"],
        "system_fingerprint": None,
    }


def completion(kind: Kind, job: JobView, echo: bool = False) -> dict[str, Any]:
    """A finished job as a `chat.completion` or `text_completion` object: one choice per completion
    (n), with logprobs when the job has them; `echo` puts the prompt (and its tokens) first."""
    if job["status"] is not JobStatus.SUCCEEDED:
        refused = job["error"]
        if refused and refused["type"] == "invalid_request":  # the engine refused the request: a 400
            raise errors.InvalidRequest(refused["message"] or "the model refused the request")
        raise JobNotCompleted(job)
    choices = [_choice(kind, job, index, sample, echo) for index, sample in enumerate(samples(job))]
    return envelope(kind, job, kind.obj) | {"choices": choices, "usage": usage_of(job)}


def samples(job: JobView) -> list[JobChoice | JobOutput]:
    """A succeeded job's completions: its choices (n or best_of), else its one output."""
    output = output_of(job)
    choices = output.get("choices")
    return list(choices) if choices else [output]


def _choice(
    kind: Kind, job: JobView, index: int, sample: JobChoice | JobOutput, echo: bool
) -> dict[str, Any]:
    tokens = _scored_tokens(job, sample, echo)
    choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": sample["finish_reason"]}
    if kind is Kind.CHAT:
        choice["message"] = {"role": "assistant", "content": sample["text"], "refusal": None}
        if tokens is not None:
            choice["logprobs"] = {"content": [chat_logprob(token) for token in tokens], "refusal": None}
    else:
        choice["text"] = (job["input"]["prompt"] if echo else "") + sample["text"]
        if tokens is not None:
            choice["logprobs"] = text_logprobs(tokens, 0)
    return choice


def _scored_tokens(job: JobView, sample: JobChoice | JobOutput, echo: bool) -> list[TokenLogprob] | None:
    """A completion's token entries to show: its own, after the prompt's when echoing."""
    tokens = sample.get("logprobs")
    if tokens is None:
        return None
    prompt = output_of(job).get("prompt_logprobs") or [] if echo else []
    return [*prompt, *tokens]


def chat_logprob(token: TokenLogprob) -> dict[str, Any]:
    """OpenAI's ChatCompletionTokenLogprob."""
    top = [{"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode())}
           for t in token["top_logprobs"]]  # fmt: skip
    return {"token": token["token"], "logprob": token["logprob"], "bytes": list(token["token"].encode()),
            "top_logprobs": top}  # fmt: skip


def text_logprobs(tokens: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """OpenAI's completions Logprobs: parallel lists; text_offset counts from `offset` in the text.
    Each top_logprobs dict also holds the chosen token (so up to logprobs + 1 entries, as OpenAI)."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token["text"])
    return {
        "tokens": [token["token"] for token in tokens],
        "token_logprobs": [token["logprob"] for token in tokens],
        "top_logprobs": [
            None
            if token["logprob"] is None
            else {t["token"]: t["logprob"] for t in token["top_logprobs"]}
            | {token["token"]: token["logprob"]}
            for token in tokens
        ],
        "text_offset": offsets,
    }

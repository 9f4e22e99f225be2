"""Jobs as the job store returns them, to build OpenAI's objects from without a worker."""

from __future__ import annotations

from typing import Any, cast

from shared.schemas import JobErrorView, JobOutput, JobStatus, JobView, TokenLogprob

#: When the test jobs were created, and the same instant as OpenAI's `created` (Unix seconds).
CREATED_AT, CREATED = "2026-12-01T20:00:00Z", 1796155200


def token(text: str, logprob: float | None, *top: tuple[str, float]) -> TokenLogprob:
    """A token's log-probability entry as a worker records it (workers/engine/sampling/logprobs.py)."""
    return {"id": 0, "token": text, "text": text, "logprob": logprob,
            "top_logprobs": [{"id": 0, "token": t, "logprob": lp} for t, lp in top]}  # fmt: skip


def sample(
    text: str, finish_reason: str = "stop", logprobs: list[TokenLogprob] | None = None
) -> dict[str, Any]:
    """One completion of a job's output (OpenAI's choice)."""
    completion: dict[str, Any] = {"text": text, "finish_reason": finish_reason}
    return completion if logprobs is None else completion | {"logprobs": logprobs}


def finished_job(
    *samples: dict[str, Any],
    status: JobStatus = JobStatus.SUCCEEDED,
    error: JobErrorView | None = None,
    prompt: str | None = "Say",
    prompt_logprobs: list[TokenLogprob] | None = None,
) -> JobView:
    """A job that ended: succeeded with `samples` (one: its output; more: its choices), or not."""
    output: dict[str, Any] | None = None
    if status is JobStatus.SUCCEEDED:
        output = dict(samples[0]) if len(samples) == 1 else {"choices": list(samples)}
        output["usage"] = {"prompt_tokens": 3, "completion_tokens": 5}
        if prompt_logprobs is not None:
            output["prompt_logprobs"] = prompt_logprobs
    return {
        "id": "job-1", "status": status, "model": "random-tiny", "model_label": None, "error": error,
        "created_at": CREATED_AT, "started_at": CREATED_AT, "completed_at": CREATED_AT, "cached": False,
        "metadata": {}, "urls": {"get": "/v1/jobs/job-1", "cancel": "/v1/jobs/job-1/cancel",
                                 "stream": "/v1/jobs/job-1/stream"},
        "input": {"prompt": prompt}, "output": cast(JobOutput | None, output),  # what OpenAI's objects read
        "metrics": {"queue_ms": 1.0, "inference_ms": 2.0, "batch_size": 1},
    }  # fmt: skip

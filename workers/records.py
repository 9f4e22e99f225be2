"""A job's record in the engine's terms and back: its stored input becomes a GenerationRequest,
a GenerationResult becomes the record fields that end the job (with its last output deltas, a
JobOutcome)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from shared.schemas import JobStatus
from shared.structured import schema_of
from workers.engine import GenerationRequest, GenerationResult, SamplingParams
from workers.engine.types import OutputUpdate
from workers.publish import Delta, token_entry


class JobOutcome(NamedTuple):
    """How a job a worker ran ends: the record fields that say so, and what of its output is not
    in its stream yet (written ahead of the finish, in its round trip: WorkerJobs.finish)."""

    fields: dict[str, str | bytes]
    deltas: list[Delta]


def generation_request(
    job_id: str, job_input: dict[str, Any], timeout_s: float, on_output: Callable[[OutputUpdate], None]
) -> GenerationRequest:
    """The engine's request for a job's stored input, due `timeout_s` from now."""
    params = SamplingParams(
        max_tokens=job_input["max_tokens"],
        temperature=job_input["temperature"],
        top_p=job_input["top_p"],
        seed=job_input["seed"],
        stop=tuple(job_input["stop"]),
        presence_penalty=job_input.get("presence_penalty", 0.0),
        frequency_penalty=job_input.get("frequency_penalty", 0.0),
        repetition_penalty=job_input.get("repetition_penalty", 1.0),
        # JSON keeps the token ids as strings; jobs stored before the field have none.
        logit_bias=tuple(
            (int(token), float(bias)) for token, bias in job_input.get("logit_bias", {}).items()
        ),
        min_tokens=job_input.get("min_tokens", 0),
        logprobs=job_input.get("logprobs"),
        prompt_logprobs=job_input.get("prompt_logprobs"),
        json_schema=schema_of(job_input.get("response_format")),
        n=job_input.get("n", 1),
        best_of=job_input.get("best_of"),
    )
    return GenerationRequest(
        request_id=job_id,
        params=params,
        prompt=job_input["prompt"],
        messages=job_input["messages"],
        template=job_input.get("template", "chat"),
        deadline=time.monotonic() + timeout_s,
        on_output=on_output,
    )


def success_fields(result: GenerationResult) -> dict[str, str | bytes]:
    """The record fields of a succeeded job."""
    output: dict[str, object] = {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "cached_prompt_tokens": result.cached_prompt_tokens,
        },
    }
    if result.logprobs is not None:
        output["logprobs"] = [token_entry(entry) for entry in result.logprobs]
    if result.prompt_logprobs is not None:
        output["prompt_logprobs"] = [token_entry(entry) for entry in result.prompt_logprobs]
    if result.choices:
        output["choices"] = [choice_entry(choice) for choice in result.choices]
    metrics = {"inference_ms": round(result.inference_ms, 3), "batch_size": result.batch_size}
    return {
        "status": JobStatus.SUCCEEDED.value,
        "output": orjson.dumps(output),
        "metrics": orjson.dumps(metrics),
    }


def choice_entry(choice: GenerationResult) -> dict[str, object]:
    """One of several samples (n or best_of), as the job's output lists them (shared.schemas.JobChoice)."""
    entry: dict[str, object] = {"text": choice.text, "finish_reason": choice.finish_reason,
                                "completion_tokens": choice.completion_tokens}  # fmt: skip
    if choice.logprobs is not None:
        entry["logprobs"] = [token_entry(token) for token in choice.logprobs]
    return entry

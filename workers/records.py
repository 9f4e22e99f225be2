"""A job's record in the engine's terms and back: its stored spec becomes a GenerationRequest,
a GenerationResult becomes the job's output and the record fields that end the job (with its last
output deltas, a JobOutcome). The record's encoding is shared/jobqueue/records.py's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from shared.jobqueue.records import succeeded_fields
from shared.jobspec import JobSpec
from shared.schemas import JobChoice, JobOutput
from workers.engine import GenerationRequest, GenerationResult, SamplingParams
from workers.engine.types import OutputUpdate
from workers.publish import Delta, token_entry


class JobOutcome(NamedTuple):
    """How a job a worker ran ends: the record fields that say so, and what of its output is not
    in its stream yet (written ahead of the finish, in its round trip: WorkerJobs.finish)."""

    fields: dict[str, str | bytes]
    deltas: list[Delta]


def generation_request(
    job_id: str, spec: JobSpec, timeout_s: float, on_output: Callable[[OutputUpdate], None]
) -> GenerationRequest:
    """The engine's request for a job's spec, due `timeout_s` from now. Its SamplingParams are
    read off the spec field by field (every Sampling field, and the schema its response format
    asks for), so a field added to the spec reaches the engine with nothing written here."""
    return GenerationRequest(
        request_id=job_id,
        params=SamplingParams.model_validate(spec, from_attributes=True),
        prompt=spec.prompt,
        messages=None if spec.messages is None else [dict(message) for message in spec.messages],
        template=spec.template,
        deadline=time.monotonic() + timeout_s,
        on_output=on_output,
    )


def job_output(result: GenerationResult) -> JobOutput:
    """The job's output (shared.schemas.JobOutput) of the engine's result."""
    output: JobOutput = {
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
    return output


def success_fields(result: GenerationResult) -> dict[str, str | bytes]:
    """The record fields of a succeeded job."""
    return succeeded_fields(job_output(result), result.inference_ms, result.batch_size)


def choice_entry(choice: GenerationResult) -> JobChoice:
    """One of several samples (n or best_of), as the job's output lists them."""
    entry: JobChoice = {"text": choice.text, "finish_reason": choice.finish_reason,
                        "completion_tokens": choice.completion_tokens}  # fmt: skip
    if choice.logprobs is not None:
        entry["logprobs"] = [token_entry(token) for token in choice.logprobs]
    return entry

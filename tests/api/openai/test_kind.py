"""api/openai/kind.py: each completion flavour names its objects and ids as OpenAI's API does (the
official clients and SDK types check `object`), and records its own source on the job."""

from __future__ import annotations

from api.openai.kind import Kind
from api.openai.requests import ChatCompletionRequest, CompletionRequest, job_create


def test_each_flavour_names_its_objects_and_ids_as_openai() -> None:
    assert (Kind.CHAT.obj, Kind.CHAT.chunk_obj, Kind.CHAT.id_prefix) == (
        "chat.completion",
        "chat.completion.chunk",
        "chatcmpl-",
    )
    text = ("text_completion", "text_completion", "cmpl-")
    assert (Kind.TEXT.obj, Kind.TEXT.chunk_obj, Kind.TEXT.id_prefix) == text


def test_a_jobs_source_says_which_endpoint_created_it() -> None:
    """Operators tell OpenAI traffic from the jobs API's by the metadata `source` (GET /v1/jobs)."""
    chat = job_create(ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}]}))
    text = job_create(CompletionRequest.model_validate({"prompt": "x"}))
    assert chat.metadata["source"] == Kind.CHAT.source == "openai.chat.completions"
    assert text.metadata["source"] == Kind.TEXT.source == "openai.completions"

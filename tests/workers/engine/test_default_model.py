"""Correctness on the real default model (SmolLM2-135M-Instruct, one thread), on each backend: the
transformers model (fp32, dequantized) and llama.cpp (the Q4_1 GGUF file itself)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams
from workers.engine.types import GenerationResult

pytestmark = pytest.mark.slow

PROMPTS = [
    "Hi!",
    "What is the capital of France?",
    "Name the three primary colors of paint, and nothing else.",
    "Write one sentence about the moon and the stars.",
    "Explain in two sentences why the sky is blue during the day.",
    "List the first five prime numbers and say what makes a number prime.",
    "You are planning a picnic for six friends. Suggest what food and drinks to bring, and why.",
    "Describe, step by step, how to make a cup of tea with loose leaves, a kettle and a teapot, "
    "for someone who has never done it before.",
]


def _chat(request_id: str, prompt: str, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(**{"max_tokens": 24, **params})
    return GenerationRequest(request_id, sampling, messages=[{"role": "user", "content": prompt}])


def _error(future: concurrent.futures.Future[GenerationResult], timeout: float = 60) -> RequestError:
    with pytest.raises(RequestError) as caught:
        future.result(timeout)
    return caught.value


def test_batched_greedy_is_identical_to_solo(backend_engine: EngineFactory) -> None:
    """On llama.cpp in its batch-invariant layout (a KV stream per row; the default shares one KV
    cache, where a job's output stays near its solo output: llamacpp/test_executor.py)."""
    engine = backend_engine(max_batch_size=8, llamacpp_batch_invariant=True)
    together = [engine.submit(_chat(f"b{i}", p)) for i, p in enumerate(PROMPTS)]
    batched = [future.result(120) for future in together]
    solo = [engine.submit(_chat(f"s{i}", p)).result(60) for i, p in enumerate(PROMPTS)]
    assert max(r.batch_size for r in batched) == len(PROMPTS)
    assert all(r.batch_size == 1 for r in solo)
    assert [(r.text, r.completion_tokens) for r in batched] == [(r.text, r.completion_tokens) for r in solo]
    assert len({r.prompt_tokens for r in batched}) == len(PROMPTS)  # really different lengths


def test_the_default_model_knows_the_capital_of_france(backend_engine: EngineFactory) -> None:
    """The default model on the default settings, greedy: the sentence's continuation is Paris. (Its
    chat answer to "What is the capital of France?" is Paris on transformers, not on llama.cpp,
    whose kernels round activations to 8 bits: a 135M model's greedy answer tips over.)"""
    request = GenerationRequest("paris", SamplingParams(max_tokens=4), prompt="The capital of France is")
    result = backend_engine().submit(replace(request, template="none")).result(60)
    assert result.text.startswith(" Paris")


def test_short_job_overtakes_long_ones_and_cancel_frees_them(backend_engine: EngineFactory) -> None:
    engine = backend_engine(max_batch_size=4)
    started = threading.Event()
    long_jobs = [
        engine.submit(
            GenerationRequest(
                f"long{i}",
                SamplingParams(max_tokens=256, ignore_eos=True),
                messages=[{"role": "user", "content": f"Tell me a very long story number {i}."}],
                on_output=lambda update: started.set(),
            )
        )
        for i in range(3)
    ]
    assert started.wait(60)
    short = engine.submit(_chat("short", "Say hello.", max_tokens=16, ignore_eos=True))
    result = short.result(60)
    assert result.completion_tokens == 16
    assert not any(job.done() for job in long_jobs), "a 16-token job waited for 256-token ones"
    assert result.batch_size == 4
    for i in range(3):
        engine.cancel(f"long{i}")
    for job in long_jobs:
        assert _error(job, timeout=10).type == "canceled"
    assert engine.stats().running == 0


def test_deadline_stops_a_running_job(backend_engine: EngineFactory) -> None:
    engine = backend_engine(max_batch_size=2)
    deadline = time.monotonic() + 1.0
    request = _chat("slow", "Count to one thousand.", max_tokens=512, ignore_eos=True)
    request.deadline = deadline
    assert _error(engine.submit(request)).type == "timeout"
    assert time.monotonic() - deadline < 2.0


def test_stop_strings_and_max_tokens(backend_engine: EngineFactory) -> None:
    engine = backend_engine()
    prompt = "Write a short poem about the sea."
    full = engine.submit(_chat("full", prompt, max_tokens=32, ignore_eos=True)).result(60)
    assert full.finish_reason == "length" and full.completion_tokens == 32
    words = full.text.split()
    stop = words[len(words) // 2]
    cut = engine.submit(_chat("cut", prompt, max_tokens=32, ignore_eos=True, stop=(stop, "zzzz"))).result(60)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert stop not in cut.text


def test_eos_ends_with_stop(backend_engine: EngineFactory) -> None:
    engine = backend_engine()
    result = engine.submit(_chat("eos", "What is 2 + 2? Answer with one number.", max_tokens=64)).result(60)
    assert result.finish_reason == "stop"
    assert result.completion_tokens < 64
    assert "<|im_end|>" not in result.text and "4" in result.text


#: Each backend's context: the model's for transformers, EngineConfig.llamacpp_sequence_tokens's
#: default (each row's own KV stream) for llama.cpp.
CONTEXT = {"torch": 8192, "llamacpp": 2048}


def test_prompt_longer_than_context_is_rejected(
    backend_engine: EngineFactory, request: pytest.FixtureRequest
) -> None:
    context = CONTEXT[request.node.callspec.params["backend_engine"]]
    engine = backend_engine()
    error = _error(
        engine.submit(GenerationRequest("huge", SamplingParams(max_tokens=4), prompt="hello " * 9000))
    )
    assert error.type == "invalid_request"
    assert f"the model's context is {context} tokens" in error.message
    assert error.message.startswith("prompt is ")
    assert engine.submit(_chat("next", "Hi!", max_tokens=2)).result(60).completion_tokens == 2


def test_same_seed_same_text(backend_engine: EngineFactory) -> None:
    engine = backend_engine(max_batch_size=4)
    params = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 20}
    first = engine.submit(_chat("x1", "Invent a name for a cat.", seed=11, **params)).result(60)
    crowd = [engine.submit(_chat(f"c{i}", "Invent a name for a dog.", seed=i, **params)) for i in range(2)]
    second = engine.submit(_chat("x2", "Invent a name for a cat.", seed=11, **params)).result(60)
    assert second.text == first.text
    assert second.batch_size > 1
    for future in crowd:
        future.result(60)

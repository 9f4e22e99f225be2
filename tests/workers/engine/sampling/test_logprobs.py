"""Log-probabilities: a solo transformers forward pass on the same checkpoint agrees to 1e-4 (fp32),
batched or not, with or without penalties (they are the raw model's, as vLLM returns by default)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pydantic
import pytest
import torch

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams
from workers.engine.sampling.logprobs import log_softmax
from workers.engine.torch.loading import LoadedModel
from workers.engine.types import GenerationResult, OutputUpdate

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time there was a", "def add(a, b):"]


def _raw(request_id: str, prompt: str, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(**{"max_tokens": 8, "logprobs": 5, **params})
    return GenerationRequest(request_id, sampling, prompt=prompt, template="none")


def _reference(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """log-softmax of one plain forward pass over ids: row j scores the token at j + 1."""
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _check_against_reference(loaded: LoadedModel, prompt: str, result: GenerationResult) -> None:
    prompt_ids = loaded.tokenizer(prompt).input_ids
    completion = [entry.token_id for entry in result.logprobs or ()]
    reference = _reference(loaded, prompt_ids + completion)
    for offset, entry in enumerate(result.logprobs or ()):
        row = reference[len(prompt_ids) + offset - 1]
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-4)
        values, ids = row.topk(len(entry.top))
        assert [token for token, _, _ in entry.top] == ids.tolist()
        assert [value for _, _, value in entry.top] == pytest.approx(values.tolist(), abs=1e-4)
    if result.prompt_logprobs is not None:
        assert [entry.token_id for entry in result.prompt_logprobs] == prompt_ids
        assert result.prompt_logprobs[0].logprob is None
        for position, entry in enumerate(result.prompt_logprobs[1:], start=1):
            assert entry.logprob == pytest.approx(float(reference[position - 1, entry.token_id]), abs=1e-4)


def test_batched_logprobs_match_a_solo_forward_pass(
    random_engine: EngineFactory, random_model: LoadedModel
) -> None:
    engine = random_engine(max_batch_size=4)
    variants: list[dict[str, object]] = [
        {},
        {"temperature": 1.0, "seed": 1, "prompt_logprobs": 2},
        {"frequency_penalty": 2.0, "logit_bias": {2644: 1.0}},  # chooses differently, scores raw
        {"repetition_penalty": 1.5, "logprobs": 0},
    ]
    futures = [
        engine.submit(_raw(f"r{i}", p, **v)) for i, (p, v) in enumerate(zip(PROMPTS, variants, strict=True))
    ]
    results = [future.result(30) for future in futures]
    assert max(result.batch_size for result in results) > 1
    for prompt, result in zip(PROMPTS, results, strict=True):
        _check_against_reference(random_model, prompt, result)
        assert result.logprobs is not None and len(result.logprobs) == result.completion_tokens
        assert "".join(entry.text for entry in result.logprobs) == result.text
    assert results[3].logprobs is not None and all(entry.top == () for entry in results[3].logprobs)


def test_scoring_a_prompt_generates_nothing(random_engine: EngineFactory, random_model: LoadedModel) -> None:
    engine = random_engine()
    request = _raw("score", PROMPTS[0], max_tokens=0, logprobs=None, prompt_logprobs=1)
    result = engine.submit(request).result(30)
    assert (result.text, result.completion_tokens, result.finish_reason) == ("", 0, "length")
    assert result.logprobs is None
    assert result.prompt_logprobs is not None and len(result.prompt_logprobs) == result.prompt_tokens
    assert "".join(entry.text for entry in result.prompt_logprobs) == PROMPTS[0]
    _check_against_reference(random_model, PROMPTS[0], result)
    with pytest.raises(RequestError, match="max_tokens 0 generates nothing"):
        engine.submit(_raw("nothing", PROMPTS[0], max_tokens=0)).result(30)
    with pytest.raises(pydantic.ValidationError, match="logprobs"):  # the spec's bound (0..20)
        _raw("many", PROMPTS[0], logprobs=21)


@pytest.mark.slow
def test_default_model_logprobs_match_transformers(
    default_engine: EngineFactory, default_model: LoadedModel
) -> None:
    engine = default_engine(max_batch_size=4)
    futures = [engine.submit(_raw(f"d{i}", p, prompt_logprobs=5)) for i, p in enumerate(PROMPTS)]
    for prompt, future in zip(PROMPTS, futures, strict=True):
        _check_against_reference(default_model, prompt, future.result(60))


def test_streamed_logprobs_are_the_results_own(random_engine: EngineFactory) -> None:
    """Each on_output update carries the entries streamed so far: a prefix of the result's entries
    (the same tokens, texts and numbers), whose texts lie inside the update's text."""
    engine = random_engine(output_interval_s=0.0)
    updates: list[OutputUpdate] = []
    request = _raw("streamed", "Once upon a time", max_tokens=40, ignore_eos=True, temperature=1.0, seed=3)
    result = engine.submit(replace(request, on_output=updates.append)).result(60)
    final = result.logprobs or ()
    assert len(updates) >= 10 and len(final) == 40
    for update in updates:
        streamed = update.logprobs or ()
        assert streamed == final[: len(streamed)]
        assert update.text.startswith("".join(entry.text for entry in streamed))
    assert len(updates[-1].logprobs or ()) >= 30  # streamed as it went, not left for the end


def test_log_softmax_is_fp32_exact_on_strided_logits() -> None:
    """The torch path's logits can be a transposed view: a strided row must score as a contiguous
    one (numpy sums a strided axis element by element; fp32 drifted ~1e-4 over 49,152 entries)."""
    logits = (np.random.default_rng(0).standard_normal((49152, 4)) * 8).astype(np.float32).T  # strided rows
    exact = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    exact -= np.log(np.exp(exact).sum(axis=-1, keepdims=True))
    assert not logits.flags["C_CONTIGUOUS"]
    assert np.abs(log_softmax(logits) - exact).max() < 1e-5

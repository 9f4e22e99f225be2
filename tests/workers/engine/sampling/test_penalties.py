"""Penalties, logit_bias and min_tokens: their formulas, their effect on real generations (random-tiny),
and batched output equal to solo output when every row asks for something different."""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any

import numpy as np
import pydantic
import pytest

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams
from workers.engine.sampling.penalties import adjust_logits
from workers.engine.torch.loading import LoadedModel
from workers.engine.types import GenerationResult


def _request(request_id: str, prompt: str = "the same prompt", **params: Any) -> GenerationRequest:
    sampling = SamplingParams(**{"max_tokens": 16, "ignore_eos": True, **params})
    return GenerationRequest(request_id, sampling, prompt=prompt)


def _error(future: concurrent.futures.Future[GenerationResult]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        future.result(30)
    return caught.value


def test_adjustments_follow_vllms_formulas_row_by_row() -> None:
    logits = np.array([[2.0, -1.0, 0.5, 3.0]] * 3, dtype=np.float32)
    params = [
        SamplingParams(max_tokens=8, repetition_penalty=2.0),
        SamplingParams(max_tokens=8, frequency_penalty=0.5, presence_penalty=0.25, logit_bias={3: -10.0}),
        SamplingParams(max_tokens=8),  # untouched
    ]
    prompts = [[0], [0], [0]]
    completions = [[1], [0, 0, 2], [1]]
    adjusted = adjust_logits(logits, params, prompts, completions, eos_ids={3})
    # Seen tokens (prompt 0, completion 1): positive logits divided, negative multiplied.
    np.testing.assert_allclose(adjusted[0], [1.0, -2.0, 0.5, 3.0])
    # Completion counts {0: 2, 2: 1}: 2 - 0.5*2 - 0.25 and 0.5 - 0.5 - 0.25; token 3 biased by -10.
    np.testing.assert_allclose(adjusted[1], [0.75, -1.0, -0.25, -7.0])
    np.testing.assert_array_equal(adjusted[2], logits[2])
    assert adjusted is not logits and logits[0, 0] == 2.0  # a copy: the raw logits stay as they were
    short = SamplingParams(max_tokens=8, min_tokens=2)
    masked = adjust_logits(logits[:1], [short], [[0]], [[1]], eos_ids={3})
    assert masked[0, 3] == -math.inf and masked[0, 0] == 2.0


def test_logit_bias_steers_greedy_generation(random_engine: EngineFactory, random_model: LoadedModel) -> None:
    engine = random_engine()
    token = random_model.tokenizer(" cat").input_ids[0]
    plain = engine.submit(_request("plain", max_tokens=6)).result(30)
    forced = engine.submit(_request("forced", max_tokens=6, logit_bias={token: 100.0})).result(30)
    assert forced.text == random_model.tokenizer.decode([token] * 6)
    assert plain.text != forced.text


def test_penalties_break_a_repetition(random_engine: EngineFactory, random_model: LoadedModel) -> None:
    engine = random_engine()
    # random-tiny's logits lie within +-0.7: a bias of 1.0 makes " cat" every step's argmax...
    cat = {random_model.tokenizer(" cat").input_ids[0]: 1.0}
    assert engine.submit(_request("plain", logit_bias=cat)).result(30).text == " cat" * 16
    # ... until a penalty takes enough back once " cat" has been said.
    for name, value in (("frequency_penalty", 2.0), ("presence_penalty", 2.0), ("repetition_penalty", 2.0)):
        penalised = (
            engine.submit(_request(name, "the same prompt", logit_bias=cat, **{name: value})).result(30).text
        )
        assert penalised.startswith(" cat") and penalised.count(" cat") <= 2, (name, penalised)


def test_min_tokens_holds_back_the_end_of_sequence(
    random_engine: EngineFactory, random_model: LoadedModel
) -> None:
    engine = random_engine()
    eos = random_model.tokenizer.eos_token_id
    eager = {eos: 100.0}  # the end-of-sequence token is every step's argmax
    at_once = engine.submit(_request("eos", ignore_eos=False, logit_bias=eager)).result(30)
    assert (at_once.completion_tokens, at_once.finish_reason) == (1, "stop")
    held = engine.submit(_request("held", ignore_eos=False, logit_bias=eager, min_tokens=5)).result(30)
    assert (held.completion_tokens, held.finish_reason) == (6, "stop")  # 5 tokens, then the EOS


def test_batched_adjusted_output_equals_solo(random_engine: EngineFactory, random_model: LoadedModel) -> None:
    engine = random_engine(max_batch_size=8)
    token = random_model.tokenizer(" dog").input_ids[0]
    variants: list[dict[str, object]] = [
        {},
        {"frequency_penalty": 1.5},
        {"presence_penalty": -1.0},
        {"repetition_penalty": 1.8},
        {"logit_bias": {token: 5.0}},
        {"min_tokens": 10, "ignore_eos": False},
        {"frequency_penalty": 1.0, "temperature": 1.0, "seed": 3},
        {"repetition_penalty": 1.3, "temperature": 0.8, "top_p": 0.9, "seed": 4},
    ]
    prompts = [f"prompt {i} " + "word " * (3 * i) for i in range(len(variants))]

    def request(tag: str, i: int) -> GenerationRequest:
        return _request(f"{tag}-{i}", prompts[i], max_tokens=24, **variants[i])

    solo = [engine.submit(request("solo", i)).result(30) for i in range(len(variants))]
    together = [engine.submit(request("batch", i)) for i in range(len(variants))]
    batched = [future.result(60) for future in together]
    assert max(result.batch_size for result in batched) > 1
    assert [r.text for r in batched] == [r.text for r in solo]


def test_bad_adjustments_fail_alone_naming_the_field(random_engine: EngineFactory) -> None:
    engine = random_engine()
    assert "logit_bias" in _error(engine.submit(_request("v", logit_bias={10**9: 1.0}))).message
    assert "min_tokens" in _error(engine.submit(_request("m", min_tokens=17))).message
    for field, value in (("repetition_penalty", 0.0), ("presence_penalty", 2.5)):  # the spec's bounds
        with pytest.raises(pydantic.ValidationError, match=field):
            _request("r", "the same prompt", **{field: value})
    assert engine.submit(_request("fine", max_tokens=2)).result(30).completion_tokens == 2

"""Structured outputs under continuous batching: every completion parses and validates, even from
random weights (the mask alone must make it JSON), and unconstrained rows are left untouched."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import jsonschema
import pytest
import tokenizers
from llguidance import LLTokenizer

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams
from workers.engine.llamacpp.executor import LlamaCppExecutor
from workers.engine.llamacpp.model import LlamaCppModel
from workers.engine.sampling import structured
from workers.engine.sampling.structured import Grammars

#: Bounded (string lengths, integer range, array size) so that even random weights end within budget.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "colour", "tags", "member"],
    "additionalProperties": False,
}


def _request(request_id: str, schema: object = SCHEMA, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(
        **{"max_tokens": 120, "json_schema": None if schema is None else json.dumps(schema), **params}
    )
    return GenerationRequest(request_id, sampling, prompt=f"describe person {request_id} as JSON")


@pytest.mark.slow
def test_200_structured_generations_at_concurrency_16_all_validate(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=16)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # 16 clients, each waiting on its job
        futures = [
            pool.submit(lambda i: engine.submit(_request(f"p{i}", temperature=1.0, seed=i)).result(120), i)
            for i in range(200)
        ]
        results = [future.result() for future in futures]
    assert max(result.batch_size for result in results) == 16
    for result in results:
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), SCHEMA)
    assert len({result.text for result in results}) > 100  # sampled, not one answer repeated


def test_constrained_and_free_rows_share_a_batch(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=8)
    free_solo = engine.submit(_request("free", schema=None, max_tokens=12)).result(30)
    futures = [engine.submit(_request(f"s{i}", temperature=0.7, seed=i)) for i in range(4)]
    free_batched = engine.submit(_request("free", schema=None, max_tokens=12)).result(30)
    assert free_batched.text == free_solo.text  # masks touch only their own rows
    for future in futures:
        jsonschema.validate(json.loads(future.result(60).text), SCHEMA)
    obj = engine.submit(_request("object", schema={"type": "object", "maxProperties": 0})).result(30)
    assert (obj.text, obj.finish_reason) == ("{}", "stop")


def test_a_schema_that_cannot_compile_fails_the_request(random_engine: EngineFactory) -> None:
    engine = random_engine()
    with pytest.raises(RequestError, match="response_format") as caught:
        engine.submit(_request("bad", schema={"type": "strin"})).result(30)
    assert caught.value.type == "invalid_request"


def test_the_llguidance_view_is_built_by_the_first_response_format_only(
    llamacpp_engine: EngineFactory,
) -> None:
    """A worker that serves no response format never holds llguidance's ~35 MiB view of the
    tokenizer; the first response format builds it, and later ones reuse it."""
    engine = llamacpp_engine(max_batch_size=2)
    executor = engine._executor
    assert isinstance(executor, LlamaCppExecutor)
    plain = engine.submit(_request("plain", schema=None, max_tokens=4)).result(60)
    assert plain.completion_tokens == 4
    assert not executor.grammars.built
    first = engine.submit(_request("first", schema={"type": "boolean"})).result(60)
    assert first.text in ("true", "false")
    assert executor.grammars.built
    second = engine.submit(_request("second", schema={"enum": ["red", "blue"]})).result(60)
    assert json.loads(second.text) in ("red", "blue")


def test_concurrent_first_response_formats_build_one_view(
    llamacpp_model: LlamaCppModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[LLTokenizer] = []

    def counted(*args: Any, **kwargs: Any) -> LLTokenizer:
        view = LLTokenizer(*args, **kwargs)
        built.append(view)
        return view

    monkeypatch.setattr(structured, "LLTokenizer", counted)
    grammars = Grammars(llamacpp_model.tokenizer, llamacpp_model.vocab_size)
    assert not grammars.built
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        matchers = list(pool.map(lambda _: grammars.matcher('{"type": "integer"}'), range(8)))
    assert len(built) == 1
    assert grammars.built
    assert all(not matcher.is_error() for matcher in matchers)


def test_a_tokenizer_llguidance_cannot_read_fails_only_response_formats() -> None:
    class Unreadable:
        eos_token_id = 0
        backend_tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())  # no vocabulary at all

    grammars = Grammars(Unreadable(), vocab_size=49152)  # building the engine does not fail
    with pytest.raises(RequestError, match="response_format: llguidance cannot read") as caught:
        grammars.matcher('{"type": "integer"}')
    assert caught.value.type == "invalid_request"

"""top_k (vLLM's sampling field, an extra body field of OpenAI-compatible servers) end to end: taken
by POST /v1/jobs and both OpenAI routes, sampled by the real default model's worker (top_k 1 at
temperature 1 draws the greedy text, without it the same seed draws another), part of the cache
key, and refused naming it when out of bounds. The spec declares it once (shared/jobspec.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from cli.redis_server import EmbeddedRedis
from shared.cache import cache_key
from shared.schemas import JobCreate
from tests.api.live_server import served_model
from workers.engine.sampling.sampler import choose_tokens, make_generator
from workers.engine.types import SamplingParams

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Write one sentence about the moon."}]
#: Sampled at temperature 1 with this seed, the model's text leaves its greedy one early.
SAMPLED = {"temperature": 1.0, "seed": 7, "max_tokens": 24}


def test_top_k_keeps_only_the_k_likeliest_tokens() -> None:
    logits = np.random.default_rng(0).normal(size=(2, 500)).astype(np.float32)
    likeliest = np.argsort(-logits, axis=1)
    for top_k in (1, 3):
        params = [SamplingParams(max_tokens=1, temperature=2.0, seed=seed, top_k=top_k) for seed in range(2)]
        generators = [make_generator(row) for row in params]
        for _ in range(100):
            tokens = choose_tokens(logits, params, generators)
            assert all(token in likeliest[row, :top_k] for row, token in enumerate(tokens))


def test_top_k_is_part_of_the_cache_key_and_off_is_one_key() -> None:
    def key(**fields: Any) -> str | None:
        return cache_key(MODEL, "fp", JobCreate(prompt="hi", seed=1, **fields).spec(max_tokens=8))

    assert key() == key(top_k=0) == key(top_k=-1)  # off, as before the field existed
    assert len({key(), key(top_k=1), key(top_k=2)}) == 3


@pytest.fixture(scope="module")
def base_url(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One worker on the default model and one live API for the module."""
    with served_model(redis_server.url, tmp_path_factory.mktemp("top-k"), MODEL) as url:
        yield url


def _job_text(base_url: str, **fields: Any) -> str:
    body = {"model": MODEL, "messages": MESSAGES} | fields
    job = httpx.post(f"{base_url}/v1/jobs", json=body, headers={"Prefer": "wait=60"}, timeout=90).json()
    assert job["status"] == "succeeded", job
    assert job["input"]["top_k"] == fields.get("top_k", 0)
    return str(job["output"]["text"])


@pytest.mark.slow
def test_top_k_1_draws_the_greedy_text_through_every_route(base_url: str) -> None:
    greedy = _job_text(base_url, temperature=0, max_tokens=24)
    sampled = _job_text(base_url, **SAMPLED)
    assert sampled != greedy  # the seed's draw leaves the greedy text
    assert _job_text(base_url, **SAMPLED, top_k=1) == greedy
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=90)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": MESSAGES[0]["content"]}], max_tokens=24,
        temperature=1.0, seed=7, extra_body={"top_k": 1},
    )  # fmt: skip
    assert chat.choices[0].message.content == greedy
    text_greedy = client.completions.create(model=MODEL, prompt="The moon is", max_tokens=16, temperature=0)
    text_top1 = client.completions.create(
        model=MODEL, prompt="The moon is", max_tokens=16, temperature=1.0, seed=7, extra_body={"top_k": 1}
    )
    assert text_top1.choices[0].text == text_greedy.choices[0].text


@pytest.mark.slow
def test_a_top_k_out_of_bounds_is_refused_naming_it(base_url: str) -> None:
    refused = httpx.post(f"{base_url}/v1/jobs", json={"prompt": "hi", "top_k": -2})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "top_k"
    assert "greater than or equal to -1" in refused.json()["error"]["message"]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", extra_body={"top_k": 1 << 21})
    assert caught.value.status_code == 400 and isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "top_k"

"""The OpenAI-compatible endpoints, driven by the official `openai` client over real HTTP (a live
uvicorn server, a real worker running the placeholder model)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema

from shared.config import Settings
from tests.api.live_server import live_server
from tests.conftest import TEST_MODEL, WorkerProcess

JSON = {"content-type": "application/json"}


def client_for(base_url: str, api_key: str = "unused") -> openai.OpenAI:
    # No retries: a 429 or 5xx must surface as the error, not be retried away.
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def base_url(settings: Settings) -> Iterator[str]:
    with live_server(settings) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return client_for(base_url)


def test_models_lists_the_served_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [TEST_MODEL]
    assert models.data[0].object == "model" and models.data[0].owned_by == "genq"
    assert client.models.retrieve(TEST_MODEL).id == TEST_MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_a_chat_completion(client: openai.OpenAI, worker: WorkerProcess) -> None:
    completion = client.chat.completions.create(
        model=TEST_MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        max_tokens=5,
        temperature=0,
        seed=7,
        stop=["never"],
        user="tester",
        store=False,  # configures OpenAI's platform: accepted, no effect
        presence_penalty=0.5,  # honoured (routes/test_openai_sampling.py); the echo engine has no logits
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "be brief hello there be"
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 5
    details = completion.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == 0  # the echo engine has no prefix cache
    assert completion.model == TEST_MODEL


def test_a_streamed_chat_completion_with_usage(client: openai.OpenAI, worker: WorkerProcess) -> None:
    stream = client.chat.completions.create(
        model=TEST_MODEL,
        messages=[{"role": "user", "content": "one two three"}],
        max_completion_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three one two three one"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 7


def test_a_text_completion_with_and_without_streaming(
    client: openai.OpenAI, worker: WorkerProcess, base_url: str
) -> None:
    raw = client.completions.with_raw_response.create(
        model=TEST_MODEL, prompt="red green", max_tokens=3, stop="never"
    )
    completion = raw.parse()
    job = httpx.get(f"{base_url}/v1/jobs/{raw.headers['X-Genq-Job-Id']}").json()
    assert job["input"]["template"] == "none"  # a completion continues its prompt verbatim
    assert completion.object == "text_completion"
    assert completion.choices[0].text == "red green red"
    assert completion.usage is not None and completion.usage.prompt_tokens == 2
    chunks = list(client.completions.create(model=TEST_MODEL, prompt="red green", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "red green red"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_bad_requests_raise_bad_request_error(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as n_error:
        client.chat.completions.create(model=TEST_MODEL, messages=messages, n=17)
    assert n_error.value.param == "n"
    assert n_error.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as temperature_error:
        client.chat.completions.create(model=TEST_MODEL, messages=messages, temperature=3)
    assert temperature_error.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as echo_error:
        client.chat.completions.create(model=TEST_MODEL, messages=messages, extra_body={"echo": True})
    assert echo_error.value.param == "echo"
    with pytest.raises(openai.BadRequestError) as unknown_error:  # never silently dropped
        client.chat.completions.create(model=TEST_MODEL, messages=messages, extra_body={"mirostat_tau": 5.0})
    assert unknown_error.value.param == "mirostat_tau"
    with pytest.raises(openai.BadRequestError) as top_error:
        client.chat.completions.create(model=TEST_MODEL, messages=messages, top_logprobs=2)
    assert top_error.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as many_error:
        client.completions.create(model=TEST_MODEL, prompt="x", logprobs=6)
    assert many_error.value.param == "logprobs"
    with pytest.raises(openai.BadRequestError) as best_of_error:
        client.completions.create(model=TEST_MODEL, prompt="x", n=3, best_of=2)
    assert best_of_error.value.param == "best_of"
    with pytest.raises(openai.BadRequestError) as schema_error:
        bad: ResponseFormatJSONSchema = {
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": {"type": "object", "required": 5}},
        }
        client.chat.completions.create(model=TEST_MODEL, messages=messages, response_format=bad)
    assert schema_error.value.param == "response_format"
    with pytest.raises(openai.BadRequestError) as nothing_error:
        client.completions.create(model=TEST_MODEL, prompt="x", max_tokens=0)
    assert nothing_error.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as token_ids_error:  # vLLM takes them; genq does not yet
        client.completions.create(model=TEST_MODEL, prompt=[[9906, 1917]])
    assert (token_ids_error.value.param or "").startswith("prompt")
    with pytest.raises(openai.NotFoundError) as model_error:
        client.chat.completions.create(model="gpt-nope", messages=messages)
    assert model_error.value.code == "model_not_found"


def test_a_request_the_model_refuses_is_a_bad_request(client: openai.OpenAI, worker: WorkerProcess) -> None:
    """Valid for the API, refused by the engine when the job runs (the placeholder has no
    probabilities to give): the job fails `invalid_request`, and the caller gets a 400 saying why,
    not a 500 (the Schemathesis fuzz found that 500)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=TEST_MODEL, prompt="x", logprobs=2, max_tokens=2)
    assert refused.value.type == "invalid_request_error" and "logprobs" in refused.value.message


def test_errors_have_openai_shape_and_the_rest_of_the_api_keeps_genqs(base_url: str) -> None:
    broken = httpx.post(f"{base_url}/v1/chat/completions", content=b"{not json", headers=JSON, timeout=10)
    assert broken.status_code == 400
    assert set(broken.json()["error"]) == {"message", "type", "param", "code"}
    invalid = httpx.post(f"{base_url}/v1/completions", json={"prompt": "x", "max_tokens": 0}, timeout=10)
    assert invalid.status_code == 400
    assert invalid.json()["error"]["param"] == "max_tokens"
    genq = httpx.post(f"{base_url}/v1/jobs", json={"prompt": "x", "max_tokens": 0}, timeout=10)
    assert genq.status_code == 422
    assert set(genq.json()["error"]) == {"type", "message", "param"}


def test_a_wrong_key_raises_authentication_error(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    with live_server(make_settings(api_keys=["the-right-key"])) as url:
        with pytest.raises(openai.AuthenticationError) as error:
            client_for(url, "a-wrong-key").chat.completions.create(
                model=TEST_MODEL, messages=[{"role": "user", "content": "hi"}]
            )
        assert error.value.code == "invalid_api_key"
        assert [m.id for m in client_for(url, "the-right-key").models.list().data] == [TEST_MODEL]


@pytest.mark.skipif(
    importlib.util.find_spec("api.edge.ratelimit") is None,
    reason="api/edge/ratelimit.py (rate limiting) is not there yet",
)
def test_over_the_rate_limit_raises_rate_limit_error(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(rate_limit_submit="1/0.01")  # a burst of one, then one per 100 s
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        assert client.chat.completions.create(model=TEST_MODEL, messages=messages, max_tokens=1).choices
        with pytest.raises(openai.RateLimitError) as error:
            client.chat.completions.create(model=TEST_MODEL, messages=messages, max_tokens=1)
    assert error.value.code == "rate_limit_exceeded"
    assert int(error.value.response.headers["retry-after"]) >= 1


def test_a_client_leaving_a_stream_cancels_its_job(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(placeholder_step_s=0.05)
    start_worker(settings)
    body = {"model": TEST_MODEL, "prompt": "a b c d e f g h", "max_tokens": 300, "stream": True}
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            job_id = response.headers["x-genq-job-id"]
            next(line for line in response.iter_lines() if line.startswith("data: {"))
        job = http.get(f"/v1/jobs/{job_id}", params={"wait": 20}).json()
    assert job["status"] == "canceled"


def test_a_streamed_completion_refused_before_its_first_chunk_is_a_json_error(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """`stream: true` answers an event stream only once a job exists to follow: a refusal before
    that is a JSON error in OpenAI's shape, with the caller's rate-limit state, like any other."""
    settings = make_settings(rate_limit_submit="2/0.001")
    body = {"model": TEST_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
        invalid = http.post("/v1/chat/completions", json=body | {"n": 17})
        unknown = http.post("/v1/chat/completions", json=body | {"model": "gpt-nope"})
        limited = http.post("/v1/chat/completions", json=body)
    for refused in (invalid, unknown, limited):
        assert refused.headers["content-type"] == "application/json"
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    assert (invalid.status_code, invalid.json()["error"]["param"]) == (400, "n")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
    assert [r.headers["x-ratelimit-remaining"] for r in (invalid, unknown)] == ["1", "0"]
    assert (limited.status_code, limited.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    assert limited.headers["retry-after"] == "1000"
    assert redis_client.keys("genq:job:*") == []

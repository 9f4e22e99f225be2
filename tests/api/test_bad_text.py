"""Text the API cannot store is a 400 (OpenAI's routes) or 422 (genq's) naming the field, never a
500: a chat message over the content cap, and a lone surrogate anywhere in a JSON body (prompt,
message, metadata key or value, stop string). Over real HTTP; nothing is written."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from shared.config import Settings
from tests.api.live_server import live_server
from tests.conftest import assert_nothing_written

SURROGATE = "\ud800"  # _post's json.dumps writes it as the escape "\ud800"
CHAT = "/v1/chat/completions"


def _chat(content: str, at: int = 0) -> dict[str, Any]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    messages[at]["content"] = content
    return {"messages": messages}


OPENAI_CASES = [
    (CHAT, _chat("x" * 200_001, at=1), "messages[1].content", "at most 200000 characters"),
    (CHAT, _chat("a" + SURROGATE + "b"), "messages[0].content", "lone surrogate"),
    ("/v1/completions", {"prompt": SURROGATE}, "prompt", "lone surrogate"),
    (CHAT, _chat("hi") | {"user": "u" + SURROGATE}, "user", "lone surrogate"),
    (CHAT, _chat("hi") | {"stop": ["ok", SURROGATE]}, "stop[1]", "lone surrogate"),
]

GENQ_CASES = [
    ({"prompt": "x" + SURROGATE}, "prompt"),
    ({"messages": [{"role": "user", "content": SURROGATE}]}, "messages.0.content"),
    ({"prompt": "x", "metadata": {"k": SURROGATE}}, "metadata.k"),
    ({"prompt": "x", "metadata": {SURROGATE: "v"}}, "metadata"),
]


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` as JSON with any lone surrogate escaped (httpx's json= writes raw UTF-8)."""
    headers = {"Authorization": "Bearer k", "Content-Type": "application/json"}
    return httpx.post(url, content=json.dumps(body), headers=headers, timeout=30)


@pytest.fixture
def base_url(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Any:
    with live_server(make_settings(api_keys=["k"])) as url:
        yield url


@pytest.mark.parametrize(("path", "body", "param", "says"), OPENAI_CASES)
def test_openai_routes_answer_400_naming_the_field(
    base_url: str, redis_client: redis.Redis, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    answer = _post(base_url + path, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert error["message"].startswith(param) and says in error["message"]
    assert_nothing_written(redis_client)


@pytest.mark.parametrize(("body", "param"), GENQ_CASES)
def test_job_routes_answer_422_naming_the_field(
    base_url: str, redis_client: redis.Redis, body: dict[str, Any], param: str
) -> None:
    answer = _post(base_url + "/v1/jobs", body)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request", param)
    assert "lone surrogate" in error["message"]
    assert_nothing_written(redis_client)

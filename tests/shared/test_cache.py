"""Cache-key properties: equivalent requests share a key, any determining change makes a new one."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.cache import cache_key, is_cacheable
from shared.jobspec import JobSpec
from shared.schemas import JobCreate

MODEL, FINGERPRINT = "placeholder-echo", "abc123"
DEFAULT_MAX_TOKENS = 256

texts = st.text(min_size=1, max_size=40)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}),
    min_size=1,
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {
        "max_tokens": st.integers(1, 1024),
        "temperature": st.sampled_from([0.0, 0.5, 1.0]),
        "top_p": st.sampled_from([1.0, 0.9]),
        "seed": st.none() | st.integers(0, 2**63 - 1),
        "stop": st.lists(st.text(min_size=1, max_size=8), max_size=4),
    },
    optional={"priority": st.sampled_from(["interactive", "batch"]), "metadata": st.just({"a": "b"})},
).flatmap(lambda b: st.one_of(st.builds(lambda p: {**b, "prompt": p}, texts),
                              st.builds(lambda m: {**b, "messages": m}, messages)))  # fmt: skip


def _key(body: dict[str, Any], model: str = MODEL, fingerprint: str = FINGERPRINT) -> str | None:
    """The key the API computes: from the body as accepted (defaults filled, like JobQueue)."""
    create = JobCreate.model_validate_json(orjson.dumps(body))
    return cache_key(model, fingerprint, create.spec(create.max_tokens or DEFAULT_MAX_TOKENS))


def _deterministic(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "seed": 1} if body["temperature"] and body["seed"] is None else body


@settings(max_examples=200)
@given(bodies)
def test_field_order_whitespace_and_non_determining_fields_do_not_change_the_key(
    body: dict[str, Any],
) -> None:
    body = _deterministic(body)
    reordered = dict(reversed(list(body.items())))
    spaced = orjson.loads(orjson.dumps(reordered, option=orjson.OPT_INDENT_2))
    others = {**body, "priority": "batch", "metadata": {"x": "y"}, "webhook_events_filter": ["start"]}
    assert _key(body) is not None
    assert _key(body) == _key(spaced) == _key(others)


@given(bodies)
def test_default_filled_and_omitted_fields_share_a_key(body: dict[str, Any]) -> None:
    body = {k: v for k, v in body.items() if k not in ("temperature", "top_p", "seed", "stop", "max_tokens")}
    filled = {
        **body,
        "temperature": 0,
        "top_p": 1.0,
        "seed": None,
        "stop": [],
        "max_tokens": DEFAULT_MAX_TOKENS,
        "template": "chat",
    }
    assert _key(body) == _key(filled) == _key({**filled, "temperature": -0.0})


changes = st.sampled_from(
    ["max_tokens", "temperature", "top_p", "seed", "stop", "input", "model", "fingerprint"]
)


@settings(max_examples=300)
@given(bodies, changes, st.data())
def test_any_determining_change_changes_the_key(
    body: dict[str, Any], change: str, data: st.DataObject
) -> None:
    body = {**_deterministic(body), "seed": 5}  # a fixed seed keeps every variant cacheable
    model, fingerprint = MODEL, FINGERPRINT
    changed = dict(body)
    if change == "max_tokens":
        changed["max_tokens"] = body["max_tokens"] % 1024 + 1
    elif change == "temperature":
        changed["temperature"] = data.draw(
            st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]).filter(lambda t: t != body["temperature"])
        )
    elif change == "top_p":
        changed["top_p"] = 0.5 if body["top_p"] != 0.5 else 0.75
    elif change == "seed":
        changed["seed"] = 6
    elif change == "stop":
        changed["stop"] = (
            [*body["stop"][:3], "\u2603"] if body["stop"] != [*body["stop"][:3], "\u2603"] else []
        )
    elif change == "input":
        if "prompt" in changed:
            changed["prompt"] = body["prompt"] + " "
        else:
            changed["messages"] = [
                *body["messages"][:-1],
                {**body["messages"][-1], "role": _other_role(body)},
            ]
    elif change == "model":
        model = MODEL + "-2"
    else:
        fingerprint = FINGERPRINT + "0"
    assert _key(body) != _key(changed, model, fingerprint)


def _other_role(body: dict[str, Any]) -> str:
    return "user" if body["messages"][-1]["role"] != "user" else "assistant"


@given(bodies)
def test_prompt_and_the_same_text_as_a_message_are_different_requests(body: dict[str, Any]) -> None:
    body = _deterministic({k: v for k, v in body.items() if k not in ("prompt", "messages")})
    assert _key({**body, "prompt": "hi"}) != _key({**body, "messages": [{"role": "user", "content": "hi"}]})


@given(bodies)
def test_non_deterministic_or_opted_out_requests_have_no_key(body: dict[str, Any]) -> None:
    sampled = {**body, "temperature": 0.7, "seed": None}
    assert _key(sampled) is None
    assert _key({**body, "cache": False}) is None
    assert _key(_deterministic(body), fingerprint="") is None  # model revision unknown


def test_cacheable_means_greedy_or_seeded() -> None:
    def spec(**fields: Any) -> JobSpec:
        return JobSpec(prompt="hi", max_tokens=8, **fields)

    assert is_cacheable(spec(temperature=0, seed=None))
    assert is_cacheable(spec(temperature=1.3, seed=0))
    assert not is_cacheable(spec(temperature=1.3, seed=None))
    assert not is_cacheable(spec(temperature=0, seed=1, cache=False))


def test_a_raw_prompt_and_a_chat_wrapped_one_are_different_requests() -> None:
    body = {"prompt": "hi", "temperature": 0}
    assert _key(body) == _key({**body, "template": "chat"})
    assert _key(body) != _key({**body, "template": "none"})


ARRAY_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "array"}}}


def test_each_logit_adjustment_and_logprob_request_is_part_of_the_key() -> None:
    body = {"prompt": "hi", "temperature": 0, "max_tokens": 8}
    defaults = {"presence_penalty": 0, "frequency_penalty": -0.0, "repetition_penalty": 1, "logit_bias": {},
                "min_tokens": 0, "n": 1}  # fmt: skip
    assert _key(body) == _key({**body, **defaults})  # as before these fields existed
    variants: list[dict[str, Any]] = [
                {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"repetition_penalty": 1.1},
                {"logit_bias": {"7": 1}}, {"logit_bias": {"7": 2}}, {"min_tokens": 2}, {"logprobs": 0},
                {"logprobs": 2}, {"prompt_logprobs": 0}, {"n": 2}, {"n": 2, "best_of": 3},
                {"response_format": {"type": "json_object"}},
                {"response_format": ARRAY_FORMAT}]  # fmt: skip
    keys = {_key({**body, **variant}) for variant in variants}
    assert len(keys) == len(variants) and _key(body) not in keys
    assert _key({**body, "logit_bias": {"7": 1, "9": 2}}) == _key({**body, "logit_bias": {"9": 2, "7": 1}})


def test_a_response_format_is_keyed_by_what_it_enforces() -> None:
    body = {"prompt": "hi", "temperature": 0}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    named = {"type": "json_schema", "json_schema": {"name": "one", "schema": schema, "strict": True}}
    renamed = {"type": "json_schema", "json_schema": {"name": "two", "schema": schema, "description": "x"}}
    assert _key({**body, "response_format": named}) == _key({**body, "response_format": renamed})
    assert _key(body) == _key({**body, "response_format": {"type": "text"}})


#: Keys computed by the code before the job spec (commit 180958b, from the input as a dict, model
#: "m", fingerprint "fp"): the spec's generic encoding of its sampling fields hashes the same bytes,
#: so a response cached before an upgrade is still found after it.
KEYS_BEFORE_THE_SPEC = [
    ({"prompt": "hi"}, "f100df7da9100e762bab0306d07307fce1c5e4cd80d226d003af27ea2fc30b60"),
    (
        {"prompt": "hi", "temperature": 0.7, "seed": 3},
        "c75ba46bae0c3e85c81c1d1b9a0c77f9a99d6e74ba81d59577b1179203a5d7fd",
    ),
    (
        {"messages": [{"role": "user", "content": "yo"}], "max_tokens": 9},
        "c70439f52e1c4bf3f42ad1b3e3925c7bce05c99e08677804473be7aef59e2f9c",
    ),
    (
        {"prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2},
        "f9cc942fb357eabfcecfe263978867e2741e8a59d9c9e5601d3b51b6dc3ca79f",
    ),
    (
        {"prompt": "hi", "logit_bias": {"9": 2, "7": -1.5}},
        "bcbe0bac3862d9ba851e712c91681045317dcaa48a85b591cb2e9645a3fe8376",
    ),
    (
        {"prompt": "hi", "min_tokens": 3, "max_tokens": 5},
        "c2bf5a377ed82c15a4fc7195ea5fa67b6fa728cc39c144c690de257f082fca2e",
    ),
    (
        {"prompt": "hi", "logprobs": 2, "prompt_logprobs": 0},
        "abaaf55e5fb4b13f6dfaa33424c5b2a6b8878260eb507369600b3e7c801604d8",
    ),
    (
        {"prompt": "hi", "n": 2, "best_of": 3, "seed": 1, "temperature": 1},
        "a18bf21cd3ce84fbc902fa06be7cd12f244cdff598b47149e52ea4b893c5410b",
    ),
    (
        {"prompt": "hi", "template": "none", "stop": ["a", "b"]},
        "cae26ad4178ec3437afa797c5df6922b682846a2da6a5390407e8993ee98c9a2",
    ),
    (
        {"prompt": "hi", "response_format": {"type": "json_object"}},
        "65957d4b8fc993559925fbce0b5e06a07fc8ebe9aad44e868a1a2746ba998726",
    ),
    (
        {"prompt": "hi", "top_p": 0.9, "temperature": 0.0, "seed": 0},
        "746ace32ddf8eb2b3da1dcafe610df130328671bf1f5ab3ee0126f9db6cb7536",
    ),
]


@pytest.mark.parametrize(("body", "key"), KEYS_BEFORE_THE_SPEC)
def test_a_request_keeps_the_key_it_had_before_the_spec(body: dict[str, Any], key: str) -> None:
    assert _key(body, "m", "fp") == key

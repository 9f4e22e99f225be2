"""shared/errors.py: each error's `type` (what a client branches on) and the headers its answer
carries; a Redis refusal to write is recognised from its reply, anything else is not."""

from __future__ import annotations

import pytest
import redis
import redis.exceptions

from shared import errors


@pytest.mark.parametrize(
    ("error", "type_"),
    [
        (errors.InvalidRequest("x", param="temperature"), "invalid_request"),
        (errors.NotFound("x"), "not_found"),
        (errors.Conflict("x"), "conflict"),
        (errors.Unavailable("x"), "unavailable"),
        (errors.StorageRefused("x"), "unavailable"),
        (errors.QuotaExceeded("x"), "quota_exceeded"),
        (errors.ConcurrencyLimited("x", limit_name="streams", limit=2), "rate_limited"),
        (errors.Overloaded("x", retry_after_s=1), "overloaded"),
    ],
)
def test_each_error_has_its_type_and_message(error: errors.GenqError, type_: str) -> None:
    assert error.type == type_ and error.message == "x" and str(error) == "x"


def test_param_names_the_field() -> None:
    assert errors.InvalidRequest("bad", param="temperature").param == "temperature"
    assert errors.ConcurrencyLimited("x", limit_name="streams", limit=2).param == "streams"


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert errors.Overloaded("x", retry_after_s=0.2).headers == {"Retry-After": "1"}
    assert errors.Overloaded("x", retry_after_s=2.1).headers == {"Retry-After": "3"}
    assert errors.StorageRefused("x").headers == {"Retry-After": "5"}
    assert errors.QuotaExceeded("x").headers == {"Retry-After": "5"}
    assert errors.NotFound("x").headers == {}


def test_rate_limited_carries_the_limit_state() -> None:
    error = errors.RateLimited("x", limit=10, remaining=-3, reset_s=4.2, retry_after_s=0.5)
    assert error.headers == {
        "X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "5", "Retry-After": "1",
    }  # fmt: skip
    assert errors.ConcurrencyLimited("x", limit_name="streams", limit=2).headers == {
        "Retry-After": "1", "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0",
    }  # fmt: skip


def test_a_full_redis_refusal_is_storage_refused(redis_client: redis.Redis) -> None:
    """The reply of a real Redis at maxmemory, not a string made up here."""
    redis_client.config_set("maxmemory", "1")
    try:
        with pytest.raises(redis.exceptions.ResponseError) as caught:
            redis_client.set("k", "v")
    finally:
        redis_client.config_set("maxmemory", "0")
    refused = errors.storage_refusal(caught.value)
    assert isinstance(refused, errors.StorageRefused)
    assert "full" in refused.message and "nothing was written" in refused.message


@pytest.mark.parametrize(
    ("reply", "meaning"),
    [
        ("READONLY You can't write against a read only replica.", "read-only"),
        ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable", "cannot persist"),
    ],
)
def test_other_write_refusals_are_storage_refused(reply: str, meaning: str) -> None:
    refused = errors.storage_refusal(redis.exceptions.ResponseError(reply))
    assert refused is not None and meaning in refused.message


def test_other_errors_are_not_storage_refusals() -> None:
    assert errors.storage_refusal(redis.exceptions.ResponseError("WRONGTYPE Operation against a key")) is None
    assert errors.storage_refusal(ConnectionError("refused")) is None

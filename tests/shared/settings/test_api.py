"""API settings (shared/settings/api.py) as read from the environment: each bound refuses a bad
value at start-up naming the field, API keys are kept as digests only, and host lists are given
comma-separated."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pydantic
import pytest

from shared.config import Settings

#: (field, a value its bounds refuse).
REFUSED = [
    ("api_port", "0"),
    ("api_port", "65536"),
    ("api_workers", "65"),
    ("api_limit_concurrency", "0"),
    ("api_header_timeout_s", "0"),
    ("api_keep_alive_s", "0"),
    ("max_body_bytes", "1023"),
    ("max_wait_s", "301"),
    ("max_streams_per_key", "0"),
    ("max_long_polls_per_key", "0"),
    ("list_max_bytes", "4095"),
    ("idempotency_ttl_s", "59"),
    ("api_hot_paths", "maybe"),
]


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={v}" for f, v in REFUSED])
def test_a_value_out_of_bounds_is_refused_naming_the_field(
    from_env: Callable[..., Settings], field: str, value: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        from_env(**{field: value})
    assert [error["loc"] for error in refused.value.errors()] == [(field,)]


def test_good_values_are_parsed(from_env: Callable[..., Settings]) -> None:
    settings = from_env(api_port="9000", max_wait_s="0", api_hot_paths="0", api_autopipeline="false")
    assert (settings.api_port, settings.max_wait_s) == (9000, 0.0)
    assert settings.api_hot_paths is False and settings.api_autopipeline is False


def test_api_keys_are_comma_separated_and_kept_as_digests_only(from_env: Callable[..., Settings]) -> None:
    """Blanks around and between keys are dropped (a trailing comma is not an empty key, which
    would let an empty Bearer token in); the keys never show in the settings' repr."""
    settings = from_env(api_keys=" key-one, key-two ,,")
    assert settings.api_key_digests == (
        hashlib.sha256(b"key-one").digest(),
        hashlib.sha256(b"key-two").digest(),
    )
    assert "key-one" not in repr(settings) and "key-one" not in str(settings.api_keys)


def test_api_keys_given_as_a_list_count_each(make_settings: Callable[..., Settings]) -> None:
    """Code (and the test suite) passes keys as a list; each is a key, as if comma-separated."""
    settings = make_settings(api_keys=["key-one", "key-two"])
    assert len(settings.api_key_digests) == 2


def test_no_api_keys_means_no_digests(from_env: Callable[..., Settings]) -> None:
    assert from_env(api_keys="").api_key_digests == ()


def test_allowed_hosts_are_comma_separated_not_json(from_env: Callable[..., Settings]) -> None:
    assert from_env(allowed_hosts="genq.internal, 10.0.0.5:8000,").allowed_hosts == [
        "genq.internal",
        "10.0.0.5:8000",
    ]

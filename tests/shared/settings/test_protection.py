"""Rate limits and per-key bounds as settings (shared/settings/protection.py): specs that parse are
kept as given, ones that do not are refused naming where (never the value), and a key's bound
is its override or the setting."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.config import Settings
from shared.settings.protection import check_bucket_spec, check_limit_spec


def test_limits_that_parse_are_kept(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(rate_limit_submit="", rate_limit_read="10/2.5",
                             rate_limit_overrides={"key-x": {"submit": "1/1", "streams": "3"}})  # fmt: skip
    assert (settings.rate_limit_submit, settings.rate_limit_read) == ("", "10/2.5")
    assert settings.rate_limit_overrides["key-x"] == {"submit": "1/1", "streams": "3"}


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("streams", "0", "must be a whole number >= 1"),
        ("live_jobs", "1e3", "must be a whole number >= 1"),
        ("submit", "10", "must be `capacity/refill per second`"),
        ("read", "5/0", "must be `capacity/refill per second`"),
        ("colour", "1", "unknown limit; use one of submit, read, streams"),
    ],
)
def test_an_override_that_does_not_parse_is_refused_naming_the_key_and_kind(
    kind: str, value: str, message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        check_limit_spec("key-x", kind, value)
    assert str(refused.value).startswith(f"GENQ_RATE_LIMIT_OVERRIDES['key-x'][{kind!r}]")
    assert message in str(refused.value)


@pytest.mark.parametrize("spec", ["", "60/10", "1/0.5", "  "])
def test_a_bucket_spec_that_parses_or_is_empty_is_accepted(spec: str) -> None:
    check_bucket_spec("GENQ_RATE_LIMIT_SUBMIT", spec)


def test_a_keys_bound_is_its_override_else_the_setting(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_live_jobs_per_key=7, max_stored_bytes_per_key=900,
                             rate_limit_overrides={"key-x": {"live_jobs": "3"}})  # fmt: skip
    assert settings.owner_bound("key-x", "live_jobs") == 3
    assert settings.owner_bound("key-x", "stored_bytes") == 900
    assert settings.owner_bound("key-y", "live_jobs") == 7

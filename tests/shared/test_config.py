"""Settings that cannot work together, or do not parse, stop a process at start-up with a message
that names the settings involved (and never a secret's value), rather than failing later, per
request or per job (shared/config.py's cross-field rules, and the per-field validators of
shared/settings/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.config import Settings

#: (overrides, what the error must say).
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"visibility_timeout_s": 600, "job_timeout_s": 600},
     "GENQ_VISIBILITY_TIMEOUT_S (600) must exceed GENQ_JOB_TIMEOUT_S (600.0)"),
    ({"default_max_tokens": 300, "max_tokens_cap": 200},
     "GENQ_DEFAULT_MAX_TOKENS (300) exceeds GENQ_MAX_TOKENS_CAP (200)"),
    ({"lease_ttl_s": 5, "heartbeat_interval_s": 5},
     "GENQ_LEASE_TTL_S (5.0) must exceed GENQ_HEARTBEAT_INTERVAL_S"),
    ({"heartbeat_ttl_s": 4, "heartbeat_interval_s": 4, "lease_ttl_s": 30},
     "GENQ_HEARTBEAT_TTL_S (4.0) must exceed GENQ_HEARTBEAT_INTERVAL_S"),
    ({"rate_limit_submit": "60per10"}, "GENQ_RATE_LIMIT_SUBMIT must be `capacity/refill per second`"),
    ({"rate_limit_read": "0/5"}, "GENQ_RATE_LIMIT_READ must be `capacity/refill per second`"),
    ({"rate_limit_overrides": {"key-x": {"submit": "fast"}}},
     "GENQ_RATE_LIMIT_OVERRIDES['key-x']['submit'] must be `capacity/refill per second`"),
    ({"rate_limit_overrides": {"key-x": {"colour": "1"}}}, "unknown limit"),
    ({"webhook_retry_delays_s": "5,soon"}, "GENQ_WEBHOOK_RETRY_DELAYS_S: 'soon' is not a number of seconds"),
    ({"webhook_secret": "not-a-whsec-secret"}, "GENQ_WEBHOOK_SECRET"),
    ({"batch_key_weights": {"key-x": 0}}, "batch_key_weights.key-x\n  Input should be greater than 0"),
    ({"batch_interactive_reserve": 1}, "batch_interactive_reserve\n  Input should be less than 1"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "message"), REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_settings_that_cannot_work_are_refused_naming_them(
    make_settings: Callable[..., Settings], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        make_settings(**overrides)
    assert message in str(refused.value)


def test_a_refused_secret_is_not_repeated_in_the_error(make_settings: Callable[..., Settings]) -> None:
    with pytest.raises(ValueError) as refused:
        make_settings(webhook_secret="whsec_not base64 at all!")
    assert "not base64 at all" not in str(refused.value)


def test_the_environment_gives_a_child_the_same_settings_secrets_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench and the suite start workers and APIs with it: a secret must reach them whole."""
    settings = Settings(
        redis_url="redis://:s3cret@127.0.0.1:6390/2", api_keys=["k-one", "k-two"], max_batch_size=3
    )
    for name, value in settings.environment().items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child.require_redis_url() == "redis://:s3cret@127.0.0.1:6390/2"
    assert child.model_dump() == settings.model_dump()

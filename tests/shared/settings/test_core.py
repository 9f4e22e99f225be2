"""Core settings (shared/settings/core.py): every command but `genq up` needs GENQ_REDIS_URL, and
says so at start-up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shared.config import Settings


def test_a_missing_redis_url_stops_the_process_naming_the_variable(
    from_env: Callable[..., Settings],
) -> None:
    with pytest.raises(SystemExit, match="GENQ_REDIS_URL is not set"):
        from_env().require_redis_url()
    with pytest.raises(SystemExit, match="GENQ_REDIS_URL is not set"):
        from_env(redis_url="").require_redis_url()


def test_a_set_redis_url_is_used_as_given(from_env: Callable[..., Settings]) -> None:
    assert from_env(redis_url="redis://cache:6380/2").require_redis_url() == "redis://cache:6380/2"


def test_data_dir_and_dev_mode_parse_from_the_environment(from_env: Callable[..., Settings]) -> None:
    settings = from_env(data_dir="/var/lib/genq", dev="1")
    assert settings.data_dir == Path("/var/lib/genq") and settings.dev is True
    assert from_env().dev is False  # placeholder secrets are refused unless asked

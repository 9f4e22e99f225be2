"""Secrets stay secret: placeholders refuse to start outside dev mode, refused values are never
echoed, keys are SecretStr, and no log line carries a URL's credentials, path or query."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import cast

import pydantic
import pytest

from shared.config import Settings
from shared.logging import JsonFormatter, configure_logging, fields
from tests.conftest import ROOT

KEY = "sk-live-0123456789abcdef"


def test_a_refused_setting_never_echoes_its_value() -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        Settings(_env_file=None, api_keys=KEY, flower_basic_auth=f"admin:{KEY}", max_body_bytes=KEY)
    assert "max_body_bytes" in str(refused.value)
    assert KEY not in str(refused.value)
    with pytest.raises(pydantic.ValidationError) as refused:
        Settings(_env_file=None, webhook_secret=f"whsec_{KEY}!")
    assert "GENQ_WEBHOOK_SECRET" in str(refused.value) and KEY not in str(refused.value)


def test_keys_are_secret_in_every_repr() -> None:
    settings = Settings(_env_file=None, api_keys=f"{KEY},other-key", flower_basic_auth=f"admin:{KEY}")
    assert KEY not in repr(settings) and KEY not in str(settings.model_dump())
    assert len(settings.api_key_digests) == 2


def test_genq_api_refuses_to_start_on_a_placeholder_outside_dev_mode(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GENQ_REDIS_URL": "redis://127.0.0.1:1/0",
           "GENQ_API_KEYS": "CHANGE-ME-api-key-1", "GENQ_DATA_DIR": str(tmp_path)}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "api"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "GENQ_API_KEYS holds a placeholder value" in result.stderr
    assert "CHANGE-ME-api-key-1" not in result.stdout + result.stderr


def _formatted(logger: str, message: str, **event_fields: object) -> dict[str, object]:
    record = logging.LogRecord(logger, logging.WARNING, __file__, 1, message, None, None)
    if event_fields:
        record.__dict__.update(fields(**event_fields))  # as `extra=fields(...)` sets it
    return cast(dict[str, object], json.loads(JsonFormatter().format(record)))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:pw@hooks.example.com/services/T0/B0/secret?token=abc#x",
            "https://hooks.example.com/…",
        ),
        ("http://[2001:db8::1]:8443/hook?sig=1", "http://[2001:db8::1]:8443/…"),
        ("redis://:hunter2@redis:6379/0", "redis://redis:6379/…"),
    ],
)
def test_urls_in_log_lines_keep_only_scheme_host_and_port(url: str, shown: str) -> None:
    line = _formatted("genq.webhooks", "x", error=f"POST {url} failed")
    assert (line["event"], line["error"]) == ("x", f"POST {shown} failed")
    plain = _formatted("httpx", f"HTTP Request: POST {url}")  # a library's own message
    assert plain["message"] == f"HTTP Request: POST {shown}"


def test_httpx_request_lines_are_not_logged() -> None:
    configure_logging("INFO")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)


@pytest.mark.parametrize(
    "value", ["change-me-k", "CHANGEME", "ChangeMe-1", "key_change_me", "Change Me", "REPLACE-ME"]
)
def test_placeholders_are_recognised_in_any_case_or_spelling(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="GENQ_API_KEYS holds a placeholder") as refused:
        Settings(_env_file=None, api_keys=value)
    assert value not in str(refused.value)
    with pytest.raises(pydantic.ValidationError, match="GENQ_METRICS_TOKEN holds a placeholder"):
        Settings(_env_file=None, metrics_token=value)
    Settings(_env_file=None, api_keys="sk-live-7f3a9c2e")


def test_dev_mode_accepts_placeholders_only_on_loopback() -> None:
    Settings(_env_file=None, dev=True, api_keys="CHANGE-ME-api-key-1", api_host="127.0.0.1")
    with pytest.raises(pydantic.ValidationError, match=r"GENQ_DEV=1 is ignored on 0\.0\.0\.0") as refused:
        Settings(_env_file=None, dev=True, api_keys="CHANGE-ME-api-key-1", api_host="0.0.0.0")
    assert "GENQ_API_KEYS holds a placeholder" in str(refused.value)


def _genq_api(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GENQ_REDIS_URL": "redis://127.0.0.1:1/0",
            "GENQ_DATA_DIR": str(tmp_path)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "api", *args], env=base | env, cwd=tmp_path, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip


def test_genq_api_in_dev_mode_refuses_placeholders_off_loopback(tmp_path: Path) -> None:
    """`--host` decides, not GENQ_API_HOST: the k8s dev overlay binds 0.0.0.0 this way."""
    result = _genq_api(tmp_path, "--host", "0.0.0.0", "--port", "1", GENQ_DEV="1",
                       GENQ_API_KEYS="CHANGE-ME-api-key-1", GENQ_METRICS_TOKEN="metrics-token-1")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "GENQ_API_KEYS holds a placeholder value" in result.stderr
    assert "GENQ_DEV=1 is ignored on 0.0.0.0" in result.stderr
    assert "CHANGE-ME-api-key-1" not in result.stdout + result.stderr


PASSWORD = "s3cret-redis-pass"


def test_the_redis_password_shows_in_no_repr_dump_or_str() -> None:
    url = f"redis://:{PASSWORD}@redis.internal:6379/0"
    settings = Settings(_env_file=None, redis_url=url, cache_redis_url=f"redis://u:{PASSWORD}@cache:6379/1")
    for shown in (repr(settings), str(settings), settings.model_dump_json(), str(settings.model_dump())):
        assert PASSWORD not in shown
    assert settings.require_redis_url() == url  # what the clients connect with
    assert settings.cache_redis_address == f"redis://u:{PASSWORD}@cache:6379/1"


@pytest.mark.anyio
async def test_an_api_start_logs_no_redis_password(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """A start against a Redis that is down (errors are what would name the URL) and a request."""
    from cli.redis_server import free_port
    from tests.conftest import api_client, suite_settings

    caplog.set_level(logging.DEBUG)
    settings = suite_settings(f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0", tmp_path)
    async with api_client(settings, None) as api:
        assert (await api.get("/readyz")).status_code == 503
        assert (await api.post("/v1/jobs", json={"prompt": "x"})).status_code == 503
    assert caplog.records  # the app logs at DEBUG: the check below looks at real records
    assert not [record for record in caplog.records if PASSWORD in str(vars(record)) + record.getMessage()]

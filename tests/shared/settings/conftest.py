"""Settings as a process reads them at start-up: from GENQ_* environment variables only (not the
`.env` file or environment of the machine running the tests)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from shared.config import Settings


@pytest.fixture
def from_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Settings]:
    """Settings read from the given GENQ_<NAME> environment variables, every other one unset."""

    def read(**env: str) -> Settings:
        for name in [name for name in os.environ if name.startswith("GENQ_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(f"GENQ_{name.upper()}", value)
        return Settings(_env_file=None)

    return read

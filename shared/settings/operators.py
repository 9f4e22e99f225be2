"""Settings for operators: Flower's port and credentials, and what is logged."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class OperatorSettings(BaseModel):
    """Flower and logging."""

    flower_port: int = Field(5555, ge=1, le=65535)
    """Port of `genq flower`."""

    flower_basic_auth: SecretStr | None = None
    """`user:password` for Flower. Required unless Flower binds loopback."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Least severity logged."""

    log_prompts: bool = False
    """Log prompts and outputs (off: logs carry job ids and sizes only)."""

"""Settings of the `genq submit` and `genq jobs` client: the API it talks to and its key."""

from __future__ import annotations

from pydantic import BaseModel, SecretStr


class ClientSettings(BaseModel):
    """The command-line client."""

    api_url: str = "http://127.0.0.1:8000"
    """The API that `genq submit` and `genq jobs` talk to."""

    api_key: SecretStr | None = None
    """The key `genq submit` and `genq jobs` send (`--api-key` overrides it)."""

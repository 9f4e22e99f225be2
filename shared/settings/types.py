"""Field types the settings themes share."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic_settings import NoDecode

#: A list given as one comma-separated value (GENQ_MODELS=a,b), not as JSON.
CommaList = Annotated[list[str], NoDecode]


def split_commas(value: object) -> object:
    """A comma-separated text as its non-empty items (a before-validator of CommaList fields)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable from this host only (`localhost` or a loopback IP)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

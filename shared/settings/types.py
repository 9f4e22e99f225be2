"""Field types the settings themes share."""

from __future__ import annotations

from typing import Annotated

from pydantic_settings import NoDecode

#: A list given as one comma-separated value (GENQ_MODELS=a,b), not as JSON.
CommaList = Annotated[list[str], NoDecode]


def split_commas(value: object) -> object:
    """A comma-separated text as its non-empty items (a before-validator of CommaList fields)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value

"""Random identifiers: job ids and message tags."""

from __future__ import annotations

import os


def new_id() -> str:
    """A random (version 4) UUID in its canonical text form, as `str(uuid.uuid4())` gives.

    Built from the random bytes directly, skipping uuid.UUID's slower constructor and __str__:
    the API draws two of these per accepted job (tests/shared/test_ids.py checks the form).
    """
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_HEX = frozenset("0123456789abcdef")
_DASHES = (8, 13, 18, 23)


def is_job_id(text: str) -> bool:
    """Whether text has the form new_id() gives (36 characters, lowercase hex and four dashes).

    The API answers 404 for anything else before asking Redis, so no caller-chosen text ever
    becomes part of a key name (`<id>:stream` would otherwise name another key)."""
    if len(text) != 36:
        return False
    return all(text[i] == "-" for i in _DASHES) and _HEX.issuperset(text.replace("-", ""))

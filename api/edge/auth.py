"""Bearer-key authentication. Keys are known only by their SHA-256 digests and compared in
constant time; a caller is identified by a short, non-reversible owner id derived from its key."""

from __future__ import annotations

import hashlib
import hmac

from shared.config import Settings
from shared.errors import Unauthorized

ANONYMOUS = "anonymous"


def owner_of(authorization: str | None, settings: Settings) -> str:
    digests = settings.api_key_digests
    if not digests:
        return ANONYMOUS
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing API key: send `Authorization: Bearer <key>`")
    digest = hashlib.sha256(token.strip().encode()).digest()
    matched = False
    for known in digests:  # no early exit: the time taken does not say which key was close
        matched |= hmac.compare_digest(digest, known)
    if not matched:
        raise Unauthorized("invalid API key")
    return "key-" + digest.hex()[:16]

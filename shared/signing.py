"""Standard Webhooks signatures (https://www.standardwebhooks.com).

A delivery is signed as HMAC-SHA256 over "{webhook-id}.{webhook-timestamp}.{body}" and carries one
`v1,<base64>` signature per secret, space-separated: while a secret is rotated both the old and
the new one sign, so a receiver that knows either verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"  # noqa: S105  (the prefix of every secret, not a secret)


def parse_secrets(text: str) -> tuple[bytes, ...]:
    """ "whsec_<base64> whsec_<base64>" -> the HMAC keys (the decoded parts), in order."""
    found: list[bytes] = []
    for item in text.split():
        encoded = item.removeprefix(SECRET_PREFIX)
        try:
            # Receivers' libraries accept unpadded base64, so we do too.
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except binascii.Error:
            key = b""
        if not key:
            raise ValueError("GENQ_WEBHOOK_SECRET: each secret must be whsec_<non-empty base64>")
        found.append(key)
    return tuple(found)


def signature(secrets: tuple[bytes, ...], webhook_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header value: `v1,<base64>` per secret, space-separated."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in secrets
    )


def headers(secrets: tuple[bytes, ...], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt (no signature when no secret is set)."""
    result = {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp)}
    if secrets:
        result["webhook-signature"] = signature(secrets, webhook_id, timestamp, body)
    return result

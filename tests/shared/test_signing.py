"""shared/signing.py: Standard Webhooks signatures, checked with the `standardwebhooks` package a
receiver would use, and the header format docs/webhooks.md promises."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from shared.signing import headers, parse_secrets, signature

OLD = "whsec_" + base64.b64encode(b"the old secret, 24+ bytes long").decode()
NEW = "whsec_" + base64.b64encode(b"the new secret, 24+ bytes long").decode()
OTHER = "whsec_" + base64.b64encode(b"someone else's secret, long").decode()
BODY = b'{"type":"job.completed","data":{"id":"j1"}}'


def _signed(secrets: str, body: bytes = BODY) -> dict[str, str]:
    return headers(parse_secrets(secrets), "msg_1", int(time.time()), body)


def test_a_signature_verifies_with_its_secret_and_not_with_another() -> None:
    signed = _signed(NEW)
    assert Webhook(NEW).verify(BODY, signed) == {"type": "job.completed", "data": {"id": "j1"}}
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(BODY, signed)


def test_a_tampered_body_or_id_fails_verification() -> None:
    signed = _signed(NEW)
    with pytest.raises(WebhookVerificationError):
        Webhook(NEW).verify(BODY.replace(b"j1", b"j2"), signed)
    with pytest.raises(WebhookVerificationError):
        Webhook(NEW).verify(BODY, signed | {"webhook-id": "msg_2"})


def test_while_rotating_both_secrets_sign_and_either_verifies() -> None:
    signed = _signed(f"{OLD} {NEW}")
    # docs/webhooks.md: `v1,<base64 HMAC-SHA256>`, one per secret, space-separated.
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]{43}= v1,[A-Za-z0-9+/]{43}=", signed["webhook-signature"])
    for secret in (OLD, NEW):
        Webhook(secret).verify(BODY, signed)


def test_headers_carry_id_and_timestamp_and_no_signature_without_a_secret() -> None:
    assert headers((), "msg_1", 1700000000, BODY) == {
        "webhook-id": "msg_1",
        "webhook-timestamp": "1700000000",
    }
    assert set(_signed(NEW)) == {"webhook-id", "webhook-timestamp", "webhook-signature"}


def test_the_signed_content_is_id_dot_timestamp_dot_body() -> None:
    """A receiver without the package recomputes the HMAC over exactly this string."""
    key = b"k" * 32
    expected = base64.b64encode(hmac.new(key, b"msg_1.1700000000." + BODY, hashlib.sha256).digest()).decode()
    assert signature((key,), "msg_1", 1700000000, BODY) == "v1," + expected


def test_parse_secrets_accepts_unpadded_base64_in_order() -> None:
    unpadded = (
        "whsec_"
        + base64.b64encode(b"abcd").decode().rstrip("=")
        + " whsec_"
        + base64.b64encode(b"xy").decode()
    )
    assert parse_secrets(unpadded) == (b"abcd", b"xy")
    assert parse_secrets("") == ()


@pytest.mark.parametrize("text", ["whsec_", "whsec_!!!notbase64", "whsec_" + "a" * 5])
def test_parse_secrets_refuses_empty_or_invalid_base64_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="GENQ_WEBHOOK_SECRET"):
        parse_secrets(text)

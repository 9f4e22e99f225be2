"""Webhook settings (shared/settings/webhooks.py): per-key signing secrets parse into each key's
HMAC keys, and a malformed one is refused naming the setting and the key, never the secret."""

from __future__ import annotations

import base64
import json

import pytest

from shared.settings.webhooks import parse_key_secrets

SECRET = "whsec_" + base64.b64encode(b"key-a signing key").decode()


def test_per_key_secrets_parse_into_each_keys_signing_keys() -> None:
    assert parse_key_secrets(json.dumps({"key-a": SECRET})) == {"key-a": (b"key-a signing key",)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "GENQ_WEBHOOK_KEY_SECRETS must be a JSON object"),
        ('["whsec_AAAA"]', "GENQ_WEBHOOK_KEY_SECRETS must be a JSON object"),
        ('{"key-a": "plain-secret-value"}', "GENQ_WEBHOOK_KEY_SECRETS['key-a'] must be whsec_"),
    ],
)
def test_a_malformed_secret_is_refused_naming_the_key_not_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_key_secrets(text)
    assert message in str(refused.value)
    assert "plain-secret-value" not in str(refused.value)

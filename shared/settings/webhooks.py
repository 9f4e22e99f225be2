"""Settings of webhook deliveries: signing secrets (global and per key, parsed at start-up), the
timeout and retry schedule, and the target policy."""

from __future__ import annotations

import json
from functools import cached_property

from pydantic import BaseModel, Field, SecretStr, field_validator

from shared.settings.types import CommaList, split_commas
from shared.signing import parse_secrets
from shared.ssrf import HostResolver, TargetPolicy, parse_ports


class WebhookSettings(BaseModel):
    """Webhook deliveries."""

    webhook_secret: SecretStr | None = None
    """Signing secrets `whsec_<base64>`, space-separated while rotating (every delivery carries a
    signature per secret). Unset: deliveries are sent unsigned and a warning is logged."""

    webhook_key_secrets: SecretStr | None = None
    """Per-key signing secrets as JSON: {"<owner id>": "whsec_<base64>"}. A key with its own
    secret (from here, or one made with `POST /v1/webhook-secret`) has its deliveries signed with
    it and never with webhook_secret. A key with neither is signed with webhook_secret, which
    every such key shares: set webhook_require_key_secret to refuse that."""

    webhook_require_key_secret: bool = False
    """Refuse a webhook (422 naming the field) from a key that has no signing secret of its own,
    so no delivery is ever signed with the shared webhook_secret (multi-tenant installs)."""

    webhook_timeout_s: float = Field(10.0, gt=0, le=60)
    """Seconds a delivery attempt may spend connecting, sending its request, and reading the whole
    answer from when the request went out (status line and headers however slowly they come; a
    body still arriving then is cut, the status already counts)."""

    webhook_retry_delays_s: CommaList = ["5", "300", "1800", "7200", "18000", "36000"]
    """Delays before each retry of a failed delivery (jitter is added); after the last, the
    delivery is marked failed. The default spans about a day."""

    webhook_allow_private: bool = False
    """Allow webhook targets on loopback/private/link-local addresses and any port (local
    development and tests only; logged at start-up)."""

    webhook_allowed_ports: str = "80,443,8000-9999"
    """Ports a webhook target may use (comma-separated ports and ranges)."""

    webhook_resolve_timeout_s: float = Field(2.0, gt=0, le=30)
    """Seconds a submit waits for its webhook host to resolve; past it the submit is refused (422
    naming the webhook) rather than held by a name server that does not answer."""

    webhook_resolve_threads: int = Field(4, ge=1, le=64)
    """Threads of the API's own pool for resolving webhook hosts at submit (apart from the event
    loop's default pool, where Redis connections resolve)."""

    webhook_resolve_queue: int = Field(64, ge=0, le=10_000)
    """Webhook host lookups that may wait for a thread of that pool; past it (every thread busy and
    the queue full) a submit with a webhook is refused at once with 503."""

    _split_delays = field_validator("webhook_retry_delays_s", mode="before")(split_commas)

    @field_validator("webhook_retry_delays_s")
    @classmethod
    def _delays_are_numbers(cls, delays: list[str]) -> list[str]:
        for delay in delays:
            try:
                if float(delay) < 0:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"GENQ_WEBHOOK_RETRY_DELAYS_S: {delay!r} is not a number of seconds >= 0"
                ) from None
        return delays

    @field_validator("webhook_key_secrets")
    @classmethod
    def _key_secrets_parse(cls, secrets: SecretStr | None) -> SecretStr | None:
        if secrets is not None:
            parse_key_secrets(secrets.get_secret_value())
        return secrets

    @field_validator("webhook_secret")
    @classmethod
    def _secret_is_whsec(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None:
            parse_secrets(secret.get_secret_value())  # raises a ValueError that names the setting
        return secret

    @cached_property
    def key_secrets(self) -> dict[str, tuple[bytes, ...]]:
        """Per-owner signing keys from webhook_key_secrets."""
        if self.webhook_key_secrets is None:
            return {}
        return parse_key_secrets(self.webhook_key_secrets.get_secret_value())

    @cached_property
    def webhook_policy(self) -> TargetPolicy:
        resolver = HostResolver(
            self.webhook_resolve_threads, self.webhook_resolve_queue, self.webhook_resolve_timeout_s
        )
        return TargetPolicy(self.webhook_allow_private, parse_ports(self.webhook_allowed_ports), resolver)


def parse_key_secrets(text: str) -> dict[str, tuple[bytes, ...]]:
    """GENQ_WEBHOOK_KEY_SECRETS as {owner id: HMAC keys}; errors name the setting, not values."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError(
            "GENQ_WEBHOOK_KEY_SECRETS must be a JSON object of owner id -> whsec_ secret"
        ) from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError("GENQ_WEBHOOK_KEY_SECRETS must be a JSON object of owner id -> whsec_ secret")
    parsed = {}
    for owner, secret in raw.items():
        try:
            parsed[str(owner)] = parse_secrets(secret)
        except ValueError:
            raise ValueError(
                f"GENQ_WEBHOOK_KEY_SECRETS[{owner!r}] must be whsec_<non-empty base64>"
            ) from None
    return parsed

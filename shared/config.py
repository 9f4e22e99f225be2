"""Every setting of genq, in one class. Each field is the environment variable GENQ_<NAME>; the
fields are declared by theme in shared/settings/ (core, api, cache, jobs, protection, batches,
worker, engine, webhooks, operators, client), each with its docstring.

Values come from the environment, then an optional `.env` file, then the defaults there,
which are the embedded local stack's. Cross-field rules (here) fail fast at start-up with a
message naming both values.
"""

from __future__ import annotations

import json
import re
from functools import cached_property

from pydantic import SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings.api import ApiSettings
from shared.settings.batches import BatchSettings
from shared.settings.cache import CacheSettings
from shared.settings.client import ClientSettings
from shared.settings.core import CoreSettings
from shared.settings.engine import EngineSettings
from shared.settings.jobs import JobSettings
from shared.settings.operators import OperatorSettings
from shared.settings.protection import ProtectionSettings
from shared.settings.types import is_loopback
from shared.settings.webhooks import WebhookSettings
from shared.settings.worker import WorkerSettings
from shared.signing import parse_secrets


class Settings(
    # pydantic orders a model's fields from its last base to its first: the themes are listed
    # last-first so that fields (and the README's settings table) read core, API, ..., client.
    ClientSettings, OperatorSettings, WebhookSettings, EngineSettings, WorkerSettings, BatchSettings,
    ProtectionSettings, JobSettings, CacheSettings, ApiSettings, CoreSettings, BaseSettings,
):  # fmt: skip
    # hide_input_in_errors: a refused value may be an API key or a password, and start-up errors
    # end up in logs; the message names the variable and the rule, never the value.
    model_config = SettingsConfigDict(
        env_prefix="GENQ_", env_file=".env", extra="ignore", frozen=True, validate_default=True,
        hide_input_in_errors=True,
    )  # fmt: skip

    @model_validator(mode="after")
    def _no_placeholders(self) -> Settings:
        # Development mode relaxes the check only for a loopback API: on any other address a
        # placeholder key is a key the whole network knows. `genq api --host` checks its own.
        if self.dev and is_loopback(self.api_host):
            return self
        for name in placeholder_fields(self):
            raise ValueError(placeholder_refusal(name, self.api_host))
        return self

    @model_validator(mode="after")
    def _check_cross_fields(self) -> Settings:
        if self.visibility_timeout_s <= self.job_timeout_s:
            raise ValueError(
                f"GENQ_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s}) must exceed "
                f"GENQ_JOB_TIMEOUT_S ({self.job_timeout_s}), or long jobs are delivered twice"
            )
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"GENQ_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) exceeds "
                f"GENQ_MAX_TOKENS_CAP ({self.max_tokens_cap})"
            )
        if self.lease_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"GENQ_LEASE_TTL_S ({self.lease_ttl_s}) must exceed "
                f"GENQ_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s}), or leases lapse between renewals"
            )
        if self.file_storage == "s3" and not self.s3_bucket:
            raise ValueError("GENQ_FILE_STORAGE is s3 but GENQ_S3_BUCKET is unset")
        if self.file_storage == "local" and self.api_replicas > 1:
            raise ValueError(
                f"GENQ_FILE_STORAGE is local but GENQ_API_REPLICAS is {self.api_replicas}: each replica "
                "would keep its own files, unseen by the others; use GENQ_FILE_STORAGE=s3 (a bucket "
                "every replica shares) or one replica"
            )
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"GENQ_HEARTBEAT_TTL_S ({self.heartbeat_ttl_s}) must exceed "
                f"GENQ_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s})"
            )
        return self

    @property
    def cache_scoped_per_key(self) -> bool:
        return bool(self.api_key_digests) and not self.cache_shared_across_keys

    @cached_property
    def served_models(self) -> tuple[str, ...]:
        fallback = [self.fallback_model] if self.fallback_model else []
        return tuple(dict.fromkeys([self.model, *self.models, *fallback]))

    @property
    def concurrency(self) -> int:
        return self.worker_concurrency or self.max_batch_size

    def environment(self) -> dict[str, str]:
        """These settings as the `GENQ_*` variables that give a child process the same ones,
        secrets included (for a child's environment only: never log it)."""
        env: dict[str, str] = {}
        for name, value in self.model_dump(exclude_none=True).items():
            if isinstance(value, list):
                text = ",".join(value)
            elif isinstance(value, dict):
                text = json.dumps(value)
            elif isinstance(value, SecretStr):
                text = value.get_secret_value()
            else:
                text = str(value)
            env[f"GENQ_{name.upper()}"] = text
        return env


#: What the shipped secret templates hold instead of a secret.
PLACEHOLDER = "CHANGE-ME"
#: The words a placeholder is recognised by, once lower-cased and stripped of everything but
#: letters and digits: so `CHANGE-ME`, `change_me`, `ChangeMe`, `change me`, `REPLACE-ME` all count.
PLACEHOLDER_WORDS = ("changeme", "replaceme")
#: The settings that hold a secret (checked for placeholders), besides the webhook secrets.
SECRET_FIELDS = ("api_keys", "api_key", "flower_basic_auth", "redis_url", "cache_redis_url", "metrics_token",
                 "s3_access_key_id", "s3_secret_access_key")  # fmt: skip


def is_placeholder(text: str | bytes) -> bool:
    """Whether a secret's text (or decoded bytes) holds a placeholder word, in any case or spelling."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    squeezed = re.sub(r"[^a-z0-9]", "", text.lower())
    return any(word in squeezed for word in PLACEHOLDER_WORDS)


def placeholder_fields(settings: Settings) -> list[str]:
    """The secret-bearing settings that hold a placeholder (a webhook secret is checked decoded:
    the template's is base64 of a CHANGE-ME text)."""
    found = []
    for name in SECRET_FIELDS:
        value = getattr(settings, name)
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if text and is_placeholder(text):
            found.append(name)
    secret = settings.webhook_secret
    signing_keys = list(parse_secrets(secret.get_secret_value())) if secret is not None else []
    if any(is_placeholder(key) for key in signing_keys):
        found.append("webhook_secret")
    if any(is_placeholder(key) for keys in settings.key_secrets.values() for key in keys):
        found.append("webhook_key_secrets")
    return found


def placeholder_refusal(name: str, host: str) -> str:
    """Why a placeholder in setting `name` stops a process whose API binds `host`."""
    dev = "" if is_loopback(host) else f" (GENQ_DEV=1 is ignored on {host}, not loopback)"
    return (f"GENQ_{name.upper()} holds a placeholder value ({PLACEHOLDER} or alike){dev}: set a real one, "
            "or GENQ_DEV=1 for a development stack on loopback")  # fmt: skip


def exposure_refusal(settings: Settings, host: str) -> str | None:
    """Why `genq api` must not serve on `host` with these settings, or None: off loopback it needs
    API keys (or allow_anonymous), a /metrics token, and no placeholder secret even in dev mode."""
    if is_loopback(host):
        return None
    if not settings.api_key_digests and not settings.allow_anonymous:
        return (f"refusing to serve anonymously on {host}: set GENQ_API_KEYS, or GENQ_ALLOW_ANONYMOUS=1 "
                "on a trusted network")  # fmt: skip
    if settings.metrics_token is None:
        return (f"refusing to serve /metrics openly on {host}: set GENQ_METRICS_TOKEN (Prometheus sends "
                "it as `Authorization: Bearer <token>`)")  # fmt: skip
    for name in placeholder_fields(settings):
        return placeholder_refusal(name, host)
    return None

"""Settings every genq process reads: development mode, the Redis it works on, its local state."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, SecretStr


class CoreSettings(BaseModel):
    """Development mode and connections."""

    dev: bool = False
    """Development mode, honoured only while api_host is loopback: accept placeholder secrets
    (values containing `CHANGE-ME` in any case or spelling, as the templates in
    k8s/components/placeholder-secrets hold). Off, or on a non-loopback api_host: genq refuses to
    start on them."""

    redis_url: SecretStr | None = None
    """Redis (or Valkey) URL used as Celery broker and job store (it may carry a password, so it
    never shows in a repr, dump or log). Unset: `genq up` starts an embedded server under
    data_dir; every other command refuses to start."""

    data_dir: Path = Path(".genq")
    """Local state of the embedded stack: the embedded Redis's files, converted models, pidfiles."""

    def require_redis_url(self) -> str:
        """The Redis URL, password included (for clients only: never log it)."""
        url = self.redis_url.get_secret_value() if self.redis_url is not None else ""
        if not url:
            raise SystemExit("GENQ_REDIS_URL is not set (only `genq up` starts an embedded server)")
        return url

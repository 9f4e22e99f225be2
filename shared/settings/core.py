"""Settings every genq process reads: development mode, the Redis it works on, its local state."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel


class CoreSettings(BaseModel):
    """Development mode and connections."""

    dev: bool = False
    """Development mode: accept placeholder secrets (values containing `CHANGE-ME`, as the
    templates in k8s/components/placeholder-secrets hold). Off: genq refuses to start on them."""

    redis_url: str | None = None
    """Redis (or Valkey) URL used as Celery broker and job store. Unset: `genq up` starts an
    embedded server under data_dir; every other command refuses to start."""

    data_dir: Path = Path(".genq")
    """Local state of the embedded stack: the embedded Redis's files, converted models, pidfiles."""

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SystemExit("GENQ_REDIS_URL is not set (only `genq up` starts an embedded server)")
        return self.redis_url

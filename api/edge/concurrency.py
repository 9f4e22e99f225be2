"""Per-key limits on requests that are held open: output streams and long-polls.

A held request costs the process memory and a task for as long as it lasts, whatever the token
buckets (api/edge/ratelimit.py) say about how often it may start, so a key that opened thousands would
starve every other key's. Each API process counts what each key holds and refuses the one past
the key's limit with 429 (ConcurrencyLimited names the limit); nobody else is refused. Counted
per process, not in Redis: a count in Redis would outlive a process that died holding slots.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from shared.config import Settings
from shared.errors import ConcurrencyLimited

Held = Literal["streams", "long_polls"]
_SETTING = {"streams": "GENQ_MAX_STREAMS_PER_KEY", "long_polls": "GENQ_MAX_LONG_POLLS_PER_KEY"}
_WHAT = {"streams": "open streams", "long_polls": "waiting requests"}


class Slot:
    """One held request; release() is idempotent (a stream may end by several paths)."""

    __slots__ = ("_held", "_kind", "_limits", "_owner")

    def __init__(self, limits: ConcurrencyLimits, owner: str, kind: Held) -> None:
        self._limits, self._owner, self._kind, self._held = limits, owner, kind, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limits.release(self._owner, self._kind)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class ConcurrencyLimits:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._held: Counter[tuple[str, Held]] = Counter()

    def limit(self, owner: str, kind: Held) -> int:
        override = self._settings.rate_limit_overrides.get(owner, {}).get(kind)
        if override is not None:
            return int(override)
        return (
            self._settings.max_streams_per_key if kind == "streams" else self._settings.max_long_polls_per_key
        )

    def acquire(self, owner: str, kind: Held) -> Slot:
        """A slot, or ConcurrencyLimited when the owner holds its limit already."""
        limit = self.limit(owner, kind)
        if self._held[owner, kind] >= limit:
            raise ConcurrencyLimited(
                f"this key holds {limit} {_WHAT[kind]}, its limit ({_SETTING[kind]}, or `{kind}` in "
                "GENQ_RATE_LIMIT_OVERRIDES); close one first",
                limit_name=kind,
                limit=limit,
            )
        self._held[owner, kind] += 1
        return Slot(self, owner, kind)

    def release(self, owner: str, kind: Held) -> None:
        self._held[owner, kind] -= 1
        if self._held[owner, kind] <= 0:
            del self._held[owner, kind]

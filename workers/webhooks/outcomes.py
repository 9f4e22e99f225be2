"""What one webhook attempt's result means for its delivery (workers/webhooks/delivery.py): delivered,
gone, refused, failed for good, or retried after the schedule's next delay plus jitter."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from shared.config import Settings
from workers.webhooks.client import AttemptResult

#: Retry delays get up to this fraction added at random, so receivers that failed together are
#: not all retried in the same second.
JITTER_FRACTION = 0.1


class Outcome(enum.StrEnum):
    """A delivery's `outcome` (its state's field and the delivery log's), or one attempt's."""

    PENDING = "pending"
    RETRYING = "retrying"  # an attempt's only: the delivery stays pending
    DELIVERED = "delivered"
    FAILED = "failed"
    GONE = "gone"
    REFUSED = "refused"
    SKIPPED = "skipped"


FINAL_OUTCOMES = frozenset(set(Outcome) - {Outcome.PENDING, Outcome.RETRYING})


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    #: Seconds until the next attempt; None when the delivery is over.
    retry_in: float | None


def retry_delays(settings: Settings) -> list[float]:
    return [float(delay) for delay in settings.webhook_retry_delays_s]


def verdict(result: AttemptResult, attempt: int, delays: list[float]) -> Verdict:
    """What one attempt's result means for the delivery."""
    if result.refused:
        return Verdict(Outcome.REFUSED, None)
    if result.status_code is not None and 200 <= result.status_code < 300:
        return Verdict(Outcome.DELIVERED, None)
    if result.status_code == 410:
        return Verdict(Outcome.GONE, None)
    if attempt <= len(delays):
        delay = delays[attempt - 1]
        return Verdict(Outcome.RETRYING, delay + random.uniform(0, delay * JITTER_FRACTION))
    return Verdict(Outcome.FAILED, None)

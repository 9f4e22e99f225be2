"""workers/webhooks/outcomes.py: what one webhook attempt's result means: final outcomes, and retries on
the schedule with jitter until it runs out."""

from __future__ import annotations

from workers.webhooks.client import AttemptResult
from workers.webhooks.outcomes import JITTER_FRACTION, Outcome, Verdict, verdict


def _attempt(status: int | None = None, error: str | None = None, refused: bool = False) -> AttemptResult:
    return AttemptResult(status, error, refused, duration_ms=1.0)


def test_final_verdicts() -> None:
    for result, outcome in [
        (_attempt(200), Outcome.DELIVERED),
        (_attempt(299), Outcome.DELIVERED),
        (_attempt(410), Outcome.GONE),
        (_attempt(None, "refused", True), Outcome.REFUSED),
    ]:
        assert verdict(result, 1, [5.0]) == Verdict(outcome, None)


def test_a_failed_attempt_is_retried_on_schedule_with_jitter_then_fails() -> None:
    for result in (_attempt(500), _attempt(301), _attempt(None, "timeout: no answer within 10 s")):
        for attempt, delay in enumerate([5.0, 300.0], start=1):
            retry = verdict(result, attempt, [5.0, 300.0])
            assert retry.outcome is Outcome.RETRYING
            assert delay <= (retry.retry_in or 0) <= delay * (1 + JITTER_FRACTION)
        assert verdict(result, 3, [5.0, 300.0]).outcome is Outcome.FAILED
